/* The time the host takes from a busy CPU: pinned to CPU, a loop reads the
 * clock for SECONDS and records every gap between two reads longer than
 * 1 us (an interrupt, the hypervisor running something else on the vCPU, a
 * task the scheduler put there). scripts/latency-vs-mpi.sh runs it on the
 * ranks' CPUs beside the runs: no all_reduce's calls can be steadier than
 * the CPUs they run on, and on the 2-vCPU development VM each CPU loses
 * 300-700 gaps a second of 20-50 us.
 *
 *   host_gaps CPU SECONDS   prints "gaps CPU SECONDS G1 G2 ...", each gap in us
 */
#define _GNU_SOURCE
#include <sched.h>
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
	if (argc != 3) {
		fprintf(stderr, "usage: %s CPU SECONDS\n", argv[0]);
		return 2;
	}
	int cpu = atoi(argv[1]);
	double seconds = atof(argv[2]);
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (seconds <= 0 || sched_setaffinity(0, sizeof(set), &set) != 0) {
		fprintf(stderr, "host_gaps: cannot run on CPU %d for %s s\n", cpu, argv[2]);
		return 2;
	}
	/* At most one gap per microsecond: room for every one. */
	size_t room = (size_t)(seconds * 1e6) + 1, count = 0;
	double *gaps = malloc(room * sizeof(double));
	if (!gaps)
		return 2;
	/* Faulted in now: a page first written in the loop would be a gap. */
	memset(gaps, 0, room * sizeof(double));
	double start = now_us(), last = start;
	while (last - start < seconds * 1e6) {
		double time = now_us();
		if (time - last > 1.0 && count < room)
			gaps[count++] = time - last;
		last = time;
	}
	printf("gaps %d %g", cpu, seconds);
	for (size_t i = 0; i < count; i++)
		printf(" %.1f", gaps[i]);
	printf("\n");
	free(gaps);
	return 0;
}
