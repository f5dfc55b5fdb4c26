/* unmapped32: a 32-bit program (built by tests/e2e/bad_input.rs with -m32
 * -static) that goes on in an anonymous page after unmapping its own file,
 * so its executable is mapped nowhere: what a process shows in the middle
 * of its exec, before the kernel has mapped the new file.
 *
 * Prints "ready" once its file is unmapped, then waits in pause(2) forever.
 */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

int main(int argc, char **argv)
{
	(void)argc;
	const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
	unsigned long lo = 0, hi = 0, s, e;
	char line[512], path[256];
	FILE *maps = fopen("/proc/self/maps", "r");
	if (!maps)
		return 1;
	while (fgets(line, sizeof line, maps))
		if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %255s", &s, &e, path) == 3 && strstr(path, name)) {
			lo = lo ? lo : s;
			hi = e;
		}
	fclose(maps);
	if (!lo)
		return 1;
	/* mov eax, 91 (munmap); mov ebx, lo; mov ecx, hi - lo; int 0x80;
	 * mov ebx, 1; mov ecx, "ready\n"; mov edx, 6; mov eax, 4 (write); int 0x80;
	 * 1: mov eax, 29 (pause); int 0x80; jmp 1b */
	unsigned char code[64] = {0xb8, 91, 0, 0, 0, 0xbb, 0, 0, 0, 0, 0xb9, 0, 0, 0, 0, 0xcd, 0x80,
				  0xbb, 1, 0, 0, 0, 0xb9, 0, 0, 0, 0, 0xba, 6, 0, 0, 0, 0xb8, 4, 0, 0, 0, 0xcd, 0x80,
				  0xb8, 29, 0, 0, 0, 0xcd, 0x80, 0xeb, 0xf7};
	unsigned char *page = mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED)
		return 1;
	unsigned long len = hi - lo, ready = (unsigned long)(page + 64);
	memcpy(code + 6, &lo, 4);
	memcpy(code + 11, &len, 4);
	memcpy(code + 23, &ready, 4);
	memcpy(page, code, sizeof code);
	memcpy(page + 64, "ready\n", 6);
	((void (*)(void))page)();
	return 0;
}
