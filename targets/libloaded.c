/* libloaded: a library that `dlcycle` loads, calls and unloads, over and
 * over. Its initializer calls `loaded_work` too, and the library counts
 * every call itself (`loaded_calls`): the count a tracer must match. */
#include <stdint.h>

#define TP_PROBED __attribute__((noinline, noclone, noipa, used))

static uint64_t calls;

TP_PROBED uint64_t loaded_work(uint64_t x)
{
	calls++;
	return x * 13 + 5;
}

uint64_t loaded_calls(void)
{
	return calls;
}

__attribute__((constructor)) static void loaded_init(void)
{
	loaded_work(1);
}
