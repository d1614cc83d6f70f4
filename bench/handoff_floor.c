/* The host's floor for a 2-rank one-shot all_reduce: two processes pinned
 * to CPUs 0 and 1 each copy SIZE bytes of floats into a shared window of
 * their own, post a sequence number, wait for the other's, and add the
 * other's window into their output; windows alternate, so a rank writes one
 * while its peer may still read the other. Nothing else: no library, no
 * checks, no sleeps. Each of CALLS timed calls (after WARMUP untimed) is
 * timed between back-to-back calls on each rank, and a call's time is the
 * slower rank's, as `pcieipc bench` and bench/mpi_allreduce.c --latency time
 * theirs. scripts/latency-vs-mpi.sh runs it beside them: what two cores of
 * this host give a hand-off of that size, jitter included.
 *
 *   handoff_floor SIZE CALLS WARMUP   prints "calls SIZE oop T1 ... TN", in us
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct control {
	_Alignas(128) _Atomic uint64_t posted[2][16];
};

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void pin(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof(set), &set);
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: %s SIZE CALLS WARMUP\n", argv[0]);
		return 2;
	}
	size_t bytes = strtoull(argv[1], NULL, 0);
	long calls = atol(argv[2]), warmup = atol(argv[3]);
	size_t count = bytes / sizeof(float), window = (bytes + 127) / 128 * 128;
	if (calls < 1 || warmup < 0) {
		fprintf(stderr, "handoff_floor: CALLS must be at least 1, WARMUP at least 0\n");
		return 2;
	}
	/* Both ranks' two windows, the sequence words and every call's time,
	 * shared; touched here, before any call. */
	size_t shared_bytes = sizeof(struct control) + 4 * window + 2 * calls * sizeof(double);
	char *shared = mmap(NULL, shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shared == MAP_FAILED) {
		perror("handoff_floor: mmap");
		return 2;
	}
	memset(shared, 0, shared_bytes);
	struct control *control = (struct control *)shared;
	char *windows = shared + sizeof(struct control);
	double *times = (double *)(windows + 4 * window);
	pid_t child = fork();
	if (child < 0) {
		perror("handoff_floor: fork");
		return 2;
	}
	int rank = child == 0 ? 1 : 0, other = 1 - rank;
	pin(rank);
	float *input = malloc(window), *output = malloc(window);
	if (!input || !output)
		return 2;
	for (size_t i = 0; i < count; i++)
		output[i] = input[i] = (float)((i * 7 + rank * 3) % 8);
	double last = now_us();
	for (long call = 0; call < warmup + calls; call++) {
		int parity = call & 1;
		float *mine = (float *)(windows + (2 * rank + parity) * window);
		const float *theirs = (const float *)(windows + (2 * other + parity) * window);
		memcpy(mine, input, count * sizeof(float));
		atomic_store_explicit(&control->posted[rank][0], call + 1, memory_order_release);
		while (atomic_load_explicit(&control->posted[other][0], memory_order_acquire) < (uint64_t)call + 1)
			__builtin_ia32_pause();
		for (size_t i = 0; i < count; i++)
			output[i] = input[i] + theirs[i];
		double time = now_us();
		if (call >= warmup)
			times[rank * calls + call - warmup] = time - last;
		last = time;
	}
	if (child == 0)
		_exit(output[0] == input[0] + (float)((0 * 7 + 0 * 3) % 8) ? 0 : 1);
	int status;
	waitpid(child, &status, 0);
	/* Rank 0's output: its input plus rank 1's at every element. */
	for (size_t i = 0; i < count; i++) {
		if (output[i] != (float)((i * 7) % 8) + (float)((i * 7 + 3) % 8)) {
			fprintf(stderr, "handoff_floor: element %zu is %g\n", i, output[i]);
			return 1;
		}
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "handoff_floor: rank 1 failed\n");
		return 1;
	}
	printf("calls %zu oop", bytes);
	for (long i = 0; i < calls; i++)
		printf(" %.3f", times[i] > times[calls + i] ? times[i] : times[calls + i]);
	printf("\n");
	return 0;
}
