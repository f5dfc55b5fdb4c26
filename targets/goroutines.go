// goroutines: a Go program (standard library only) with goroutines, deep
// recursion that grows goroutine stacks, and garbage collection, for
// tests/e2e/golang.rs, which builds it with Debian's Go.
//
// Every probe-able function counts its own calls. Commands (one per line on
// stdin; each answer is one line on stdout):
//
//	fib N      fib(N) -> "done fib calls=C result=R"
//	deep N     deep(N) on a new goroutine, whose stack starts small and is
//	           grown (copied) many times -> "done deep calls=C result=R"
//	spawn N    N goroutines, each allocating and calling leaf, then exiting;
//	           then a collection -> "done spawn goroutines=N leaf=C sum=S"
//	args N     args3(i, 2i, -i) and mixed("go", i, i odd, uint8(i)) for
//	           i = 1..N -> "done args calls=C sum=S"
//	add9 D     on a new goroutine, a recursion D deep that at every depth
//	           calls add9(11, 22, ..., 99), a leaf without a stack check,
//	           through tight, which takes most of what Go lets a chain of
//	           functions without stack checks take: so some calls have
//	           little stack left -> "done add9 calls=C sum=S"
//	busy T     T goroutines call leaf and allocate until "idle" -> "busy T"
//	idle       -> "idle leaf=C"
//	counts     -> "counts fib=C deep=C leaf=C args=C mixed=C"
//	quit       exits with status 0
package main

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

var fibCalls, deepCalls, leafCalls, argsCalls, mixedCalls, add9Calls int64

//go:noinline
func fib(n int) int {
	atomic.AddInt64(&fibCalls, 1)
	if n < 2 {
		return n
	}
	return fib(n-1) + fib(n-2)
}

// deep keeps a frame of a few hundred bytes, so a recursion of 100,000
// calls outgrows the goroutine's first stack many times over.
//
//go:noinline
func deep(n int) int {
	atomic.AddInt64(&deepCalls, 1)
	var pad [24]int
	pad[n%24] = n
	if n == 0 {
		return 0
	}
	return deep(n-1) + pad[n%24] - n + 1
}

//go:noinline
func leaf(x uint64) uint64 {
	atomic.AddInt64(&leafCalls, 1)
	return x*0x9e3779b97f4a7c15 ^ x>>29
}

// add9 is a leaf with nine arguments in registers and no stack check (the
// compiler leaves it out of small leaves).
//
//go:noinline
func add9(a, b, c, d, e, f, g, h, i int) int {
	atomic.AddInt64(&add9Calls, 1)
	return a + b + c + d + e + f + g + h + i
}

// tight keeps 512 bytes below its caller's checked stack pointer, without
// a stack check of its own, before it calls add9.
//
//go:nosplit
//go:noinline
func tight(x int) int {
	var pad [64]int
	pad[x&63] = x
	return add9(11, 22, 33, 44, 55, 66, 77, 88, 99) + pad[(x+1)&63]
}

// descend calls tight at every depth on the way down (its own stack check
// grows the stack as it needs).
//
//go:noinline
func descend(d int) int {
	if d == 0 {
		return tight(d)
	}
	return tight(d) + descend(d-1)
}

// count is a call, so that args3 and mixed are not leaves: the compiler
// gives small leaf functions no stack check, and tp records the arguments
// only of functions with one (they are sure of the stack it needs).
//
//go:noinline
func count(c *int64) {
	atomic.AddInt64(c, 1)
}

//go:noinline
func args3(a, b, c int64) int64 {
	count(&argsCalls)
	return a*100 + b*10 + c
}

//go:noinline
func mixed(s string, n int, odd bool, u uint8) int {
	count(&mixedCalls)
	r := len(s) + n + int(u)
	if odd {
		r++
	}
	return r
}

func spawn(n int) (uint64, int64) {
	before := atomic.LoadInt64(&leafCalls)
	var wg sync.WaitGroup
	var sum uint64
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			buf := make([]byte, 1024+i%4096)
			buf[i%len(buf)] = byte(i)
			atomic.AddUint64(&sum, leaf(uint64(i))&0xff+uint64(buf[i%len(buf)]))
		}(i)
	}
	wg.Wait()
	runtime.GC()
	return sum, atomic.LoadInt64(&leafCalls) - before
}

func main() {
	fmt.Printf("ready pid=%d\n", os.Getpid())
	in := bufio.NewScanner(os.Stdin)
	var stop chan struct{}
	var busy sync.WaitGroup
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		n := 0
		if len(f) > 1 {
			n, _ = strconv.Atoi(f[1])
		}
		switch f[0] {
		case "fib":
			before := atomic.LoadInt64(&fibCalls)
			r := fib(n)
			fmt.Printf("done fib calls=%d result=%d\n", atomic.LoadInt64(&fibCalls)-before, r)
		case "deep":
			before := atomic.LoadInt64(&deepCalls)
			done := make(chan int)
			go func() { done <- deep(n) }()
			r := <-done
			fmt.Printf("done deep calls=%d result=%d\n", atomic.LoadInt64(&deepCalls)-before, r)
		case "add9":
			before := atomic.LoadInt64(&add9Calls)
			done := make(chan int)
			go func() { done <- descend(n) }()
			r := <-done
			fmt.Printf("done add9 calls=%d sum=%d\n", atomic.LoadInt64(&add9Calls)-before, r)
		case "spawn":
			sum, leaves := spawn(n)
			fmt.Printf("done spawn goroutines=%d leaf=%d sum=%d\n", n, leaves, sum)
		case "args":
			before := atomic.LoadInt64(&argsCalls) + atomic.LoadInt64(&mixedCalls)
			var sum int64
			for i := 1; i <= n; i++ {
				sum += args3(int64(i), int64(2*i), int64(-i))
				sum += int64(mixed("go", i, i%2 == 1, uint8(i)))
			}
			calls := atomic.LoadInt64(&argsCalls) + atomic.LoadInt64(&mixedCalls) - before
			fmt.Printf("done args calls=%d sum=%d\n", calls, sum)
		case "busy":
			stop = make(chan struct{})
			sinks := make([][]byte, n)
			for t := 0; t < n; t++ {
				busy.Add(1)
				go func(t int) {
					defer busy.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						leaf(uint64(i))
						if i%64 == 0 {
							sinks[t] = make([]byte, 4096+i%512)
							runtime.Gosched()
						}
					}
				}(t)
			}
			fmt.Printf("busy %d\n", n)
		case "idle":
			if stop != nil {
				close(stop)
				busy.Wait()
				stop = nil
			}
			fmt.Printf("idle leaf=%d\n", atomic.LoadInt64(&leafCalls))
		case "counts":
			fmt.Printf("counts fib=%d deep=%d leaf=%d args=%d mixed=%d\n", atomic.LoadInt64(&fibCalls),
				atomic.LoadInt64(&deepCalls), atomic.LoadInt64(&leafCalls), atomic.LoadInt64(&argsCalls),
				atomic.LoadInt64(&mixedCalls))
		case "quit":
			return
		}
	}
}
