/* libwork: a shared library built twice, as libalpha.so and libbeta.so
 * (LIBNAME names it), so that the same function names exist in two
 * modules. `lib_work` is exported by both; `LIBNAME_only` by one each.
 */
#include <stdint.h>

#define TP_PROBED __attribute__((noinline, noclone, noipa, used))
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

TP_PROBED uint64_t lib_work(uint64_t x)
{
	return x * LIBSEED + 7;
}

TP_PROBED uint64_t CAT(LIBNAME, _only)(uint64_t x)
{
	return (x ^ LIBSEED) + 1;
}
