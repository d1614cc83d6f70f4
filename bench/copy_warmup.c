/* What this host's caches allow a cold start: at each size, fresh buffers
 * holding what both ranks of a 2-rank all_reduce of that size hold (every
 * input and output: a copy of 2 x SIZE bytes into 2 x SIZE more), written
 * first as the benchmarks' set-up writes theirs, then ITERS copies of one
 * into the other, each timed. scripts/cold-start-vs-mpi.sh prints how many
 * copies the host took to come within 10% of its steady copy time beside
 * the all_reduce's calls: where the last-level cache takes in a working set
 * over several passes (a memcpy of 64 MiB into 64 MiB took 9 passes on the
 * 2-vCPU Xeon VM, 260 MiB of L3), no all_reduce reaches its steady rate
 * sooner.
 *
 *   copy_warmup MIN_BYTES MAX_BYTES FACTOR ITERS   prints "SIZE T1 ... TN" (us) per size
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: %s MIN_BYTES MAX_BYTES FACTOR ITERS\n", argv[0]);
		return 2;
	}
	size_t min_bytes = strtoull(argv[1], NULL, 0), max_bytes = strtoull(argv[2], NULL, 0);
	size_t factor = strtoull(argv[3], NULL, 0);
	int iters = atoi(argv[4]);
	if (factor < 2 || iters < 1 || min_bytes == 0 || min_bytes > max_bytes) {
		fprintf(stderr, "copy_warmup: bad sizes\n");
		return 2;
	}
	for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
		size_t half = 2 * bytes;
		char *from = malloc(half), *to = malloc(half);
		if (!from || !to) {
			fprintf(stderr, "copy_warmup: out of memory at %zu bytes\n", bytes);
			return 1;
		}
		memset(from, 1, half);
		memset(to, 2, half);
		printf("%zu", bytes);
		for (int pass = 0; pass < iters; pass++) {
			double start = now_us();
			memcpy(to, from, half);
			printf(" %.3f", now_us() - start);
		}
		printf("\n");
		free(from);
		free(to);
	}
	return 0;
}
