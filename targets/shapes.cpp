// shapes: C++ methods, a template and a namespace, so that tp must match
// demangled names (`app::Stats::add`, `app::Stats::add(long)`) and mangled
// ones (`_ZN3app5Stats3addEl`).
//
// Commands (see common.h):
//   call add N     N calls of app::Stats::add       -> "done add calls=N checksum=ok|BAD"
//   call area N    N calls of app::Square::area (virtual)
//   call twice N   N calls of app::twice<long>
//   quit
#include "common.h"

#define NOINLINE __attribute__((noinline, noclone, noipa))

namespace app {

class Stats {
  public:
	NOINLINE long add(long x);
	long total = 0;
};

long Stats::add(long x)
{
	total += x;
	return total;
}

struct Shape {
	virtual ~Shape() = default;
	virtual long area() const = 0;
};

struct Square : Shape {
	explicit Square(long s) : side(s) {}
	NOINLINE long area() const override;
	long side;
};

long Square::area() const
{
	return side * side;
}

template <typename T> NOINLINE T twice(T x)
{
	return x * 2 + 1;
}
template long twice<long>(long);

} // namespace app

int main()
{
	char line[256];
	int failed = 0;
	app::Stats stats;
	tp_ready();
	while (tp_read_command(line, sizeof line)) {
		char what[32] = "";
		unsigned long long n = 0;
		if (sscanf(line, "call %31s %llu", what, &n) == 2) {
			long got = 0, want = 0;
			for (unsigned long long i = 0; i < n; i++) {
				long x = (long)i;
				if (strcmp(what, "add") == 0) {
					long before = stats.total;
					got += stats.add(x) - before;
					want += x;
				} else if (strcmp(what, "area") == 0) {
					app::Square sq(x & 1023);
					const app::Shape *shape = &sq;
					got += shape->area();
					want += (x & 1023) * (x & 1023);
				} else {
					got += app::twice<long>(x);
					want += x * 2 + 1;
				}
			}
			failed |= got != want;
			printf("done %s calls=%llu checksum=%s\n", what, n, got == want ? "ok" : "BAD");
		} else if (strcmp(line, "quit") == 0) {
			break;
		}
	}
	return failed;
}
