// Churn: three Java threads, each in rounds of HashMap puts and gets, a
// sort, a SHA-256 digest, small arrays and Thread.yield, every result
// checked, until a line (or the end) on stdin. Prints "ready PID" first,
// then "rounds N ok" (or the first failure). tests/e2e/runtimes.rs probes
// the JVM running it.
import java.security.MessageDigest;
import java.util.*;

public class Churn {
    static volatile boolean stop = false;
    static long EXPECTED;
    public static void main(String[] args) throws Exception {
        for (int i = 0; i < 2000; i++) EXPECTED += Integer.toString(i * 7).length();
        final long[] rounds = new long[3];
        final String[] failed = new String[1];
        Thread[] ts = new Thread[3];
        for (int k = 0; k < 3; k++) {
            final int id = k;
            ts[k] = new Thread(() -> {
                try {
                    MessageDigest md = MessageDigest.getInstance("SHA-256");
                    Random r = new Random(id);
                    while (!stop) {
                        HashMap<Integer, String> m = new HashMap<>();
                        for (int i = 0; i < 2000; i++) m.put(i, Integer.toString(i * 7));
                        long sum = 0;
                        for (int i = 0; i < 2000; i++) sum += m.get(i).length();
                        int[] a = new int[5000];
                        for (int i = 0; i < a.length; i++) a[i] = r.nextInt();
                        Arrays.sort(a);
                        for (int i = 1; i < a.length; i++) if (a[i - 1] > a[i]) throw new RuntimeException("unsorted");
                        byte[] d = md.digest(("round" + rounds[id]).getBytes());
                        if (d.length != 32) throw new RuntimeException("digest");
                        byte[][] small = new byte[1000][];
                        for (int i = 0; i < small.length; i++) small[i] = new byte[i % 64];
                        if (sum != EXPECTED) throw new RuntimeException("sum " + sum);
                        Thread.yield();
                        rounds[id]++;
                    }
                } catch (Throwable t) { failed[0] = t.toString(); }
            });
            ts[k].start();
        }
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.flush();
        System.in.read();
        stop = true;
        for (Thread t : ts) t.join();
        System.out.println("rounds " + (rounds[0] + rounds[1] + rounds[2]) + " " + (failed[0] == null ? "ok" : failed[0]));
    }
}
