/* server: a request handler whose arguments are a path and a pointer to a
 * struct with a nested struct, a length, an enum, a bool and an array, for
 * the fields `--args` and `--if` name (`req->method`, `req->uri.len`,
 * `req->ids[2]`). Each call's own log line says what the handler got.
 *
 * Commands (one per line on stdin; each answer ends with a "done" line):
 *   serve N      handle(path, req) N times, the requests varying with the
 *                call's number; one line per call:
 *                "log handle path=P method=M uri.text=U uri.len=L len=N
 *                kind=K keep=B ids2=I" -> "done serve"
 *   bad          handle with a null request, then with one at an unmapped
 *                address, then with one whose method points at unmapped
 *                memory: "log bad path=P req=0xADDR" per call -> "done bad"
 *   quit         -> exit status 0, or 1 if a result came out wrong
 */
#include "common.h"

#include <stdbool.h>
#include <sys/mman.h>

enum kind { KIND_STATIC = 1, KIND_API = 2, KIND_UPLOAD = 7 };

struct uri {
	const char *text;
	unsigned len;
};

struct request {
	const char *method;
	struct uri uri;
	long len;
	enum kind kind;
	bool keep_alive;
	short ids[4];
};

static unsigned long handled;

/* handle: reads nothing of the request but what a null pointer allows; the
 * caller logs what it passed. */
TP_PROBED int handle(const char *path, struct request *req)
{
	handled++;
	if (!req)
		return -1;
	return (int)(strlen(path) & 0xff);
}

static const char *const methods[] = {"GET", "POST", "DELETE"};
static const char *const paths[] = {"/index.html", "/api/users", "/upload/big.bin", "/"};

int main(void)
{
	tp_ready();
	char line[256];
	int bad = 0;
	long n;
	while (tp_read_command(line, sizeof line)) {
		if (sscanf(line, "serve %ld", &n) == 1) {
			for (long i = 0; i < n; i++) {
				char uri[64];
				const char *path = paths[i % 4];
				snprintf(uri, sizeof uri, "%s?n=%ld", path, i);
				struct request req = {
					.method = methods[i % 3],
					.uri = {uri, (unsigned)strlen(uri)},
					.len = (i * 37) % 200,
					.kind = i % 3 == 0 ? KIND_STATIC : i % 3 == 1 ? KIND_API : KIND_UPLOAD,
					.keep_alive = i % 2 == 0,
					.ids = {(short)i, (short)-i, (short)(i * 3 - 50), 9},
				};
				int r = handle(path, &req);
				bad |= r != (int)strlen(path);
				printf("log handle path=%s method=%s uri.text=%s uri.len=%u len=%ld kind=%s keep=%s ids2=%d\n",
				       path, req.method, req.uri.text, req.uri.len, req.len,
				       req.kind == KIND_STATIC ? "KIND_STATIC" : req.kind == KIND_API ? "KIND_API" : "KIND_UPLOAD",
				       req.keep_alive ? "true" : "false", req.ids[2]);
			}
			printf("done serve\n");
		} else if (strcmp(line, "bad") == 0) {
			/* A page that is mapped, then unmapped: nothing lies there. */
			void *gone = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (gone == MAP_FAILED)
				return 1;
			munmap(gone, 4096);
			bad |= handle("/null", NULL) != -1;
			printf("log bad path=/null req=0x0\n");
			bad |= handle("/gone", (struct request *)gone) != 5;
			printf("log bad path=/gone req=%p\n", gone);
			struct request req = {.method = (const char *)gone, .uri = {"/x", 2}, .len = 1};
			bad |= handle("/method", &req) != 7;
			printf("log bad path=/method req=%p method=%p\n", (void *)&req, gone);
			printf("done bad\n");
		} else if (strcmp(line, "quit") == 0) {
			break;
		} else {
			printf("error unknown command: %s\n", line);
		}
	}
	return bad;
}
