/* The host's cross-core copy rate now: two processes pinned to CPUs 0 and 1
 * hand a 64 KiB block back and forth through shared memory for SECONDS, each
 * reading what the other wrote and writing its own, as a 2-rank one-shot
 * all_reduce does. scripts/bench-vs-mpi.sh runs it beside every size so that
 * a table can say what the host gave both sides at the time: on a VM the same
 * loop has read 5.4-6.9 GB/s for 13 s, then 26 for a second, then 1.6, as
 * the hypervisor moved the two vCPUs (no run controls that).
 *
 *   cross_core SECONDS      prints the rate in GB/s: the bytes the two read from each other per second
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BLOCK (64 << 10)
#define STOP (-1L)

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void pin(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof set, &set) != 0) {
		perror("cross_core: sched_setaffinity (needs CPUs 0 and 1)");
		exit(1);
	}
}

int main(int argc, char **argv)
{
	double seconds = argc == 2 ? atof(argv[1]) : 0;
	if (seconds <= 0) {
		fprintf(stderr, "usage: %s SECONDS\n", argv[0]);
		return 2;
	}
	/* Two blocks, then the turn counter on a line of its own. */
	char *shared = mmap(NULL, 2 * BLOCK + 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shared == MAP_FAILED) {
		perror("cross_core: mmap");
		return 1;
	}
	_Atomic long *turn = (_Atomic long *)(shared + 2 * BLOCK);
	pid_t child = fork();
	if (child < 0) {
		perror("cross_core: fork");
		return 1;
	}
	int me = child == 0; /* the parent moves on even turns, the child on odd */
	pin(me);
	char *mine = malloc(BLOCK);
	memset(mine, me + 1, BLOCK);
	char *out = shared + me * BLOCK, *in = shared + (1 - me) * BLOCK;
	long rounds = 0;
	double started = now();
	for (;;) {
		long t;
		while ((t = atomic_load_explicit(turn, memory_order_acquire)) != STOP && (t & 1) != me)
			;
		if (t == STOP)
			break;
		if (!me && now() - started >= seconds) {
			atomic_store_explicit(turn, STOP, memory_order_release);
			break;
		}
		memcpy(mine, in, BLOCK);
		memcpy(out, mine, BLOCK);
		rounds++;
		atomic_store_explicit(turn, t + 1, memory_order_release);
	}
	if (me)
		return 0;
	double elapsed = now() - started;
	waitpid(child, NULL, 0);
	/* Each round moved a block across in each direction. */
	printf("%.2f\n", 2.0 * rounds * BLOCK / elapsed / 1e9);
	return 0;
}
