import sys, json, re, collections, hashlib, itertools, functools, math, random, io, textwrap, decimal, fractions, heapq, bisect, struct, zlib, base64
line = sys.stdin.readline()  # wait for "go"
random.seed(7)
out = []
d = {str(i): [i, i*i, {"k": i % 7}] for i in range(3000)}
s = json.dumps(d, sort_keys=True)
out.append(hashlib.sha256(s.encode()).hexdigest())
out.append(len(json.loads(s)))
words = re.findall(r"[a-z]+", textwrap.dedent(open(__file__).read()).lower())
out.append(collections.Counter(words).most_common(5))
out.append(sum(math.sqrt(i) for i in range(20000)))
out.append(str(decimal.Decimal(1) / decimal.Decimal(7)))
out.append(fractions.Fraction(3, 7) ** 5)
h = [random.random() for _ in range(5000)]; heapq.heapify(h); out.append([round(heapq.heappop(h), 6) for _ in range(3)])
out.append(bisect.bisect(sorted(h), 0.5))
out.append(struct.pack("<qd", 5, 2.5).hex())
out.append(len(zlib.compress(s.encode())))
out.append(base64.b64encode(b"tp" * 10).decode())
class A:
    def __init__(self, x): self.x = x
    def __repr__(self): return f"A({self.x})"
out.append(sorted([A(i % 13) for i in range(100)], key=lambda a: (-a.x, id(a) * 0))[:3])
try:
    {}["missing"]
except KeyError as e:
    out.append(repr(e))
gen = (i * i for i in range(1000) if i % 3)
out.append(sum(itertools.islice(gen, 100)))
out.append(functools.reduce(lambda a, b: a ^ b, range(10000)))
print("\n".join(map(str, out)))
