#!/usr/bin/env python3
"""Frida peer of tp's benchmark (benches/tp/peers.rs): attach to a running
process and hook work() with an Interceptor CModule callback.

Prints "live ..." once the hook is in, then waits for a line "stop" on stdin
(or EOF, or --max-s seconds), reads the counters, unloads the script,
detaches and prints "detached count=N leaves=M". Errors are one line
"error=...". Needs the Python package `frida` (pip install frida).
"""
import argparse
import sys
import threading
import time

try:
    import frida
except ImportError:
    print("error=frida_not_installed", flush=True)
    sys.exit(2)

CSRC = {
    # Count calls.
    "cmod": """
#include <gum/guminterceptor.h>
extern volatile gint hits;
void onEnter (GumInvocationContext * ic) { hits++; }
""",
    # Read the first argument (the cheapest way Frida has to see arguments) and count.
    "cmod_args": """
#include <gum/guminterceptor.h>
extern volatile gint hits;
extern volatile gint last;
void onEnter (GumInvocationContext * ic) {
  last = (gint) (gsize) gum_invocation_context_get_nth_argument (ic, 0);
  hits++;
}
""",
    # Count entries and exits.
    "cmod_enter_leave": """
#include <gum/guminterceptor.h>
extern volatile gint hits;
extern volatile gint leaves;
void onEnter (GumInvocationContext * ic) { hits++; }
void onLeave (GumInvocationContext * ic) { leaves++; }
""",
}

JS = r"""
const hitsMem = Memory.alloc(8), leavesMem = Memory.alloc(8), lastMem = Memory.alloc(8);
let target = null;
try { target = Process.mainModule.findSymbolByName(SYM); } catch (e) {}
if (target === null) target = DebugSymbol.fromName(SYM).address;
if (target === null || target.isNull()) throw new Error('symbol not found: ' + SYM);
const cm = new CModule(CSRC, { hits: hitsMem, leaves: leavesMem, last: lastMem });
Interceptor.attach(target, cm);
rpc.exports = {
  counts() { return [hitsMem.readS32(), leavesMem.readS32()]; },
};
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--variant", choices=sorted(CSRC), default="cmod")
    ap.add_argument("--symbol", default="work")
    ap.add_argument("--max-s", type=float, default=300.0)
    a = ap.parse_args()

    js = JS.replace("SYM", repr(a.symbol)).replace("CSRC", repr(CSRC[a.variant]))
    t0 = time.time()
    try:
        session = frida.attach(a.pid)
        script = session.create_script(js)
        errors = []
        script.on("message", lambda m, d: errors.append(m) if m.get("type") == "error" else None)
        script.load()
    except Exception as e:  # noqa: BLE001 - one line for the harness
        print("error=attach " + str(e).replace(" ", "_"), flush=True)
        sys.exit(2)
    if errors:
        print("error=script " + str(errors[0]).replace(" ", "_"), flush=True)
        session.detach()
        sys.exit(2)
    print(f"live attach_s={time.time() - t0:.4f}", flush=True)

    stop = threading.Event()

    def reader():
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=reader, daemon=True).start()
    stop.wait(a.max_s)
    try:
        hits, leaves = script.exports_sync.counts()
    except Exception as e:  # noqa: BLE001 - the target may have died
        print("error=counts " + str(e).replace(" ", "_"), flush=True)
        hits, leaves = -1, -1
    try:
        script.unload()
        session.detach()
    except Exception as e:  # noqa: BLE001
        print("error=detach " + str(e).replace(" ", "_"), flush=True)
    print(f"detached count={hits} leaves={leaves}", flush=True)


if __name__ == "__main__":
    main()
