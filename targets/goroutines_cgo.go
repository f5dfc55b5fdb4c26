// The cgo build of goroutines.go (tests/e2e/golang.rs builds both): with
// this file the program links the C library, and its threads are the C
// library's threads.
package main

// #include <unistd.h>
import "C"

func init() {
	_ = C.getpid()
}
