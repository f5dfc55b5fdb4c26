// YieldLoop: yieldLoop(N) calls Thread.yield() N times (each a call of
// libjvm's JVM_Yield from the method's compiled code), warmed up until the
// JIT has compiled it, then again and again until a line on stdin. Prints
// "ready PID" once warm. tests/e2e/jit_frames.rs names yieldLoop in
// JVM_Yield's stacks from the perf map `jcmd PID Compiler.perfmap` writes.
public class YieldLoop {
    static long calls;

    static void yieldLoop(int n) {
        for (int i = 0; i < n; i++) {
            Thread.yield();
            calls++;
        }
    }

    public static void main(String[] args) throws Exception {
        for (int i = 0; i < 200; i++) yieldLoop(1000);
        System.out.println("ready " + ProcessHandle.current().pid());
        while (System.in.available() == 0) yieldLoop(1000);
        System.out.println("calls " + calls);
    }
}
