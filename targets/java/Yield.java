// Yield N: calls Thread.yield() N times (each a call of libjvm's JVM_Yield),
// then prints "yields=N".
public class Yield {
    public static void main(String[] args) {
        int n = Integer.parseInt(args[0]);
        for (int i = 0; i < n; i++) {
            Thread.yield();
        }
        System.out.println("yields=" + n);
    }
}
