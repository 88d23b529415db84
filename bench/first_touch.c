/* What first-touching fresh anonymous memory costs on this machine, against touching it again:
 * maps SIZE_MB, writes every byte twice and prints both times. A second argument `huge` asks for
 * transparent huge pages (madvise); `populate` maps the pages in first with
 * madvise(MADV_POPULATE_WRITE) and prints what that took, so the first write finds them mapped.
 * docs/benchmarks.md, "Time to first batch" and "Small pages for a fresh process".
 * Build: gcc -O2 -o /tmp/first_touch bench/first_touch.c */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: first_touch SIZE_MB [huge|populate]\n");
        return 2;
    }
    size_t mb = strtoul(argv[1], NULL, 10), n = mb << 20;
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    const char *mode = argc > 2 ? argv[2] : "";
    int populate = strcmp(mode, "populate") == 0, huge = argc > 2 && !populate;
    if (huge && madvise(p, n, MADV_HUGEPAGE) != 0)
        perror("madvise(MADV_HUGEPAGE)");
    double tp = now_ms();
    if (populate && madvise(p, n, MADV_POPULATE_WRITE) != 0)
        perror("madvise(MADV_POPULATE_WRITE)");
    double t0 = now_ms();
    if (populate)
        printf("%zu MiB: populate %.1f ms (%.2f GB/s); ", mb, t0 - tp, n / 1e6 / (t0 - tp));
    memset(p, 1, n);
    double t1 = now_ms();
    memset(p, 2, n);
    double t2 = now_ms();
    printf("%zu MiB%s: first touch %.1f ms (%.2f GB/s), second %.1f ms (%.2f GB/s)\n", mb,
           huge ? " (THP)" : "", t1 - t0, n / 1e6 / (t1 - t0), t2 - t1,
           n / 1e6 / (t2 - t1));
    return p[n - 1] == 2 ? 0 : 1;
}
