/* MPI_Allreduce timed the way `pcieipc bench` (and nccl-tests'
 * all_reduce_perf) times all_reduce, so scripts/bench-vs-mpi.sh can print the
 * two side by side: float sum, sizes min..max by a factor, out of place and
 * in place (MPI_IN_PLACE), time averaged over ranks, busbw = algbw * 2(n-1)/n.
 *
 *   mpi_allreduce MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP
 *   mpi_allreduce --latency MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP
 *   mpi_allreduce --cold-start MIN_BYTES MAX_BYTES FACTOR ITERS
 *   mpi_allreduce --late-peer-ms MS
 *
 * --cold-start, as `pcieipc bench --cold-start` does it: at each size, fresh
 * buffers (input and output written first), then ITERS out-of-place calls
 * with no warm-up, each timed on its own; prints "SIZE T1 ... TN", each
 * call's time in us, the slowest rank's (scripts/cold-start-vs-mpi.sh).
 * --latency, as `pcieipc bench --latency` does it: the same table, from the
 * same back-to-back calls, with the clock also read between calls; after
 * each size and placement a line "calls SIZE oop|ip T1 ... TN", each timed
 * call's time in us, the slowest rank's (scripts/latency-vs-mpi.sh, and
 * `pcieipc bench --latency-peer` for its plot).
 * --late-peer-ms: rank 0 enters an 8-byte MPI_Allreduce MS milliseconds
 * before the others and reports the CPU time it uses waiting.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double thread_cpu_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Seconds per call averaged over ranks. With `stamps` (ITERS + 1 of them),
 * the clock is read between calls too, and rank 0 prints each call's time,
 * the slowest rank's, into a "calls" line. */
static double time_allreduce(float *in, float *out, size_t count, int iters, int warmup, int in_place,
			     int nranks, double *stamps)
{
	const void *send = in_place ? MPI_IN_PLACE : in;
	float *recv = in_place ? in : out;
	for (int i = 0; i < warmup; i++)
		MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	/* As `pcieipc bench` and nccl-tests: the ranks enter the timed loop together. */
	MPI_Barrier(MPI_COMM_WORLD);
	double start = MPI_Wtime(), end;
	if (stamps) {
		stamps[0] = start;
		for (int i = 0; i < iters; i++) {
			MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
			stamps[i + 1] = MPI_Wtime();
		}
		end = stamps[iters];
	} else {
		for (int i = 0; i < iters; i++)
			MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		end = MPI_Wtime();
	}
	double seconds = (end - start) / iters, sum;
	MPI_Allreduce(&seconds, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	if (stamps) {
		/* Each call's time in place of its end stamp, then the slowest
		 * rank's into the second half of the array. */
		for (int i = iters; i > 0; i--)
			stamps[i] = (stamps[i] - stamps[i - 1]) * 1e6;
		double *slowest = stamps + iters + 1;
		MPI_Allreduce(stamps + 1, slowest, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
		int rank;
		MPI_Comm_rank(MPI_COMM_WORLD, &rank);
		if (rank == 0) {
			printf("calls %zu %s", count * sizeof(float), in_place ? "ip" : "oop");
			for (int i = 0; i < iters; i++)
				printf(" %.3f", slowest[i]);
			printf("\n");
		}
	}
	return sum / nranks;
}

static int cold_start(int rank, size_t min_bytes, size_t max_bytes, size_t factor, int iters)
{
	double *times = malloc(iters * sizeof(double)), *slowest = malloc(iters * sizeof(double));
	if (!times || !slowest || factor < 2 || iters < 1)
		return 2;
	for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
		size_t count = bytes / sizeof(float);
		float *in = malloc(bytes + sizeof(float)), *out = malloc(bytes + sizeof(float));
		if (!in || !out)
			return 2;
		for (size_t i = 0; i < count; i++)
			out[i] = in[i] = (float)((i * 7 + rank * 3) % 8);
		for (int call = 0; call < iters; call++) {
			double start = MPI_Wtime();
			MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
			times[call] = (MPI_Wtime() - start) * 1e6;
		}
		MPI_Allreduce(times, slowest, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
		if (rank == 0) {
			printf("%zu", count * sizeof(float));
			for (int call = 0; call < iters; call++)
				printf(" %.3f", slowest[call]);
			printf("\n");
		}
		free(in);
		free(out);
	}
	free(times);
	free(slowest);
	return 0;
}

static int late_peer(int rank, long late_ms)
{
	double value = 1.0, result;
	if (rank != 0)
		usleep(late_ms * 1000);
	double cpu = thread_cpu_ms(), start = MPI_Wtime();
	MPI_Allreduce(&value, &result, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	double wall = (MPI_Wtime() - start) * 1e3;
	cpu = thread_cpu_ms() - cpu;
	if (rank == 0)
		printf("# late peer: rank 0 waited %.1f ms for peers %ld ms late, using %.3f ms of CPU (MPI)\n",
		       wall, late_ms, cpu);
	return 0;
}

int main(int argc, char **argv)
{
	int rank, nranks;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	if (argc == 3 && strcmp(argv[1], "--late-peer-ms") == 0) {
		late_peer(rank, atol(argv[2]));
		MPI_Finalize();
		return 0;
	}
	if (argc == 6 && strcmp(argv[1], "--cold-start") == 0) {
		int status = cold_start(rank, strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0),
					strtoull(argv[4], NULL, 0), atoi(argv[5]));
		if (status != 0) {
			fprintf(stderr, "mpi_allreduce: bad sizes or out of memory\n");
			MPI_Abort(MPI_COMM_WORLD, status);
		}
		MPI_Finalize();
		return 0;
	}
	int latency = argc == 7 && strcmp(argv[1], "--latency") == 0;
	if (argc != 6 && !latency) {
		if (rank == 0)
			fprintf(stderr,
				"usage: %s [--latency] MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP | --cold-start MIN_BYTES MAX_BYTES FACTOR ITERS | --late-peer-ms MS\n",
				argv[0]);
		MPI_Finalize();
		return 2;
	}
	char **sizes = argv + latency;
	size_t min_bytes = strtoull(sizes[1], NULL, 0), max_bytes = strtoull(sizes[2], NULL, 0);
	size_t factor = strtoull(sizes[3], NULL, 0);
	int iters = atoi(sizes[4]), warmup = atoi(sizes[5]);
	float *in = malloc(max_bytes + sizeof(float)), *out = malloc(max_bytes + sizeof(float));
	double *stamps = latency ? malloc((2 * (size_t)iters + 1) * sizeof(double)) : NULL;
	if (!in || !out || factor < 2 || iters < 1 || (latency && !stamps)) {
		fprintf(stderr, "mpi_allreduce: bad sizes or out of memory\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	/* Touched before any call: a page of stamps first written between two
	 * timed calls would fault inside the second one. */
	if (stamps)
		memset(stamps, 0, (2 * (size_t)iters + 1) * sizeof(double));
	for (size_t i = 0; i < max_bytes / sizeof(float); i++)
		in[i] = (float)((i * 7 + rank * 3) % 8);
	if (rank == 0)
		printf("#       size   oop time   oop busbw    ip time    ip busbw   (MPI_Allreduce, %d ranks)\n",
		       nranks);
	for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
		size_t count = bytes / sizeof(float);
		double oop = time_allreduce(in, out, count, iters, warmup, 0, nranks, stamps);
		double ip = time_allreduce(in, out, count, iters, warmup, 1, nranks, stamps);
		double scale = 2.0 * (nranks - 1) / nranks, size = (double)(count * sizeof(float));
		if (rank == 0)
			printf("%12zu %10.3f %11.6f %10.3f %11.6f\n", count * sizeof(float), oop * 1e6,
			       size / oop / 1e9 * scale, ip * 1e6, size / ip / 1e9 * scale);
	}
	free(in);
	free(out);
	free(stamps);
	MPI_Finalize();
	return 0;
}
