/* How long a flag takes to cross a GPU's link through host memory, by each
 * way the GPU can raise and await one: two streams (or two processes under
 * MPS) of one GPU play ping-pong through 8-byte flags in registered host
 * memory, as the copy engines' hand-off does between chunks
 * (docs/engine.md, Through host memory), and the time per round trip (two
 * hops) is printed. Optionally each flag follows a copy of PAD bytes to
 * the host on its stream (a chunk), and two more streams keep both
 * directions of the link busy with copies of BACKGROUND bytes (the other
 * rank's chunks): under load the hop is what the hand-off pays per chunk.
 *
 *   nvcc -O2 -arch=sm_90 -o flag_latency bench/flag_latency.cu -lcuda
 *   flag_latency HOW PROCS ROUND_TRIPS PAD BACKGROUND
 *
 * HOW is two letters: how a flag is raised (K a one-thread kernel's release
 * store, C an 8-byte copy-engine copy from device memory, W
 * cuStreamWriteValue32), then how it is awaited (k a one-thread kernel
 * polling it, w cuStreamWaitValue32). PROCS is 1 (two streams of one
 * process) or 2 (a process per side: start the MPS daemon first).
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef unsigned long long u64;

#define CHECK(call)                                                               \
	do {                                                                      \
		cudaError_t e = (call);                                           \
		if (e != cudaSuccess) {                                           \
			fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__,        \
				cudaGetErrorString(e));                           \
			exit(1);                                                  \
		}                                                                 \
	} while (0)
#define CHECK_DRIVER(call)                                                        \
	do {                                                                      \
		CUresult e = (call);                                              \
		if (e != CUDA_SUCCESS) {                                          \
			const char *text;                                         \
			cuGetErrorString(e, &text);                               \
			fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, text); \
			exit(1);                                                  \
		}                                                                 \
	} while (0)

/* Flags and the pad's landing area: one registered mapping, shared by the
 * processes of PROCS 2 (mapped before the fork). */
#define SHARED_BYTES (1 << 21)
/* A wait that has not seen its flag in 2 s gives up and says so. */
#define TIMEOUT_NS 2000000000ull

__device__ __forceinline__ u64 global_ns(void)
{
	u64 t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

__global__ void raise_flag(u64 *flag, u64 value)
{
	asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flag), "l"(value) : "memory");
}

__global__ void await_flag(const u64 *flag, u64 value, int *timed_out)
{
	u64 started = global_ns(), seen;
	for (;;) {
		asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(seen) : "l"(flag) : "memory");
		if (seen >= value)
			return;
		if (global_ns() - started > TIMEOUT_NS) {
			*timed_out = 1;
			return;
		}
		__nanosleep(64);
	}
}

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

struct side {
	char raise, await;
	cudaStream_t stream;
	u64 *values; /* device memory: values[i] == i, what C copies */
	int *timed_out;
	size_t pad;
	void *pad_from, *pad_to;
};

static void queue_raise(const struct side *s, u64 *flag, u64 value)
{
	if (s->pad)
		CHECK(cudaMemcpyAsync(s->pad_to, s->pad_from, s->pad, cudaMemcpyDeviceToHost, s->stream));
	if (s->raise == 'K')
		raise_flag<<<1, 1, 0, s->stream>>>(flag, value);
	else if (s->raise == 'C')
		CHECK(cudaMemcpyAsync(flag, s->values + value, 8, cudaMemcpyDeviceToHost, s->stream));
	else
		CHECK_DRIVER(cuStreamWriteValue32((CUstream)s->stream, (CUdeviceptr)flag, (cuuint32_t)value, 0));
}

static void queue_await(const struct side *s, u64 *flag, u64 value)
{
	if (s->await == 'k')
		await_flag<<<1, 1, 0, s->stream>>>(flag, value, s->timed_out);
	else
		CHECK_DRIVER(cuStreamWaitValue32((CUstream)s->stream, (CUdeviceptr)flag, (cuuint32_t)value,
						 CU_STREAM_WAIT_VALUE_GEQ));
}

/* Side `me` (0 serves, 1 returns) queues its round trips `first` to `last`:
 * flag `me` is the one it awaits, the other the one it raises. */
static void queue_side(const struct side *s, u64 *flags, int me, u64 first, u64 last)
{
	u64 *mine = flags + me * 16, *theirs = flags + (1 - me) * 16;
	for (u64 value = first; value <= last; value++) {
		if (me == 1)
			queue_await(s, mine, value);
		queue_raise(s, theirs, value);
		if (me == 0)
			queue_await(s, mine, value);
	}
}

int main(int argc, char **argv)
{
	if (argc != 6 || strlen(argv[1]) != 2 || !strchr("KCW", argv[1][0]) || !strchr("kw", argv[1][1]) ||
	    (strcmp(argv[2], "1") && strcmp(argv[2], "2")) || atoi(argv[3]) < 1) {
		fprintf(stderr, "usage: %s {K|C|W}{k|w} {1|2} ROUND_TRIPS PAD BACKGROUND\n", argv[0]);
		return 2;
	}
	int procs = atoi(argv[2]), round_trips = atoi(argv[3]);
	size_t pad = strtoull(argv[4], 0, 0), background = strtoull(argv[5], 0, 0);
	u64 *shared = (u64 *)mmap(0, SHARED_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shared == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	/* The sides this process queues. */
	int first_side = 0, sides = 2;
	if (procs == 2) {
		pid_t children[2];
		for (int me = 0; me < 2; me++) {
			children[me] = fork();
			if (children[me] < 0) {
				perror("fork");
				return 1;
			}
			if (children[me] == 0) {
				first_side = me;
				sides = 1;
				break;
			}
		}
		if (sides == 2) {
			int failed = 0, status;
			for (int me = 0; me < 2; me++) {
				waitpid(children[me], &status, 0);
				failed |= !WIFEXITED(status) || WEXITSTATUS(status);
			}
			return failed;
		}
	}
	CHECK(cudaSetDevice(0));
	CHECK(cudaHostRegister(shared, SHARED_BYTES, cudaHostRegisterMapped | cudaHostRegisterPortable));
	u64 *flags;
	CHECK(cudaHostGetDevicePointer((void **)&flags, shared, 0));
	int values = 2 * round_trips + 1, *timed_out;
	u64 *host_values = (u64 *)malloc(values * sizeof(u64)), *device_values;
	for (int i = 0; i < values; i++)
		host_values[i] = i;
	CHECK(cudaMalloc(&device_values, values * sizeof(u64)));
	CHECK(cudaMemcpy(device_values, host_values, values * sizeof(u64), cudaMemcpyHostToDevice));
	CHECK(cudaMalloc(&timed_out, sizeof(int)));
	CHECK(cudaMemset(timed_out, 0, sizeof(int)));
	struct side side[2];
	for (int k = 0; k < sides; k++) {
		side[k] = (struct side){argv[1][0], argv[1][1], 0, device_values, timed_out, pad, 0, 0};
		CHECK(cudaStreamCreateWithFlags(&side[k].stream, cudaStreamNonBlocking));
		if (pad) {
			CHECK(cudaMalloc(&side[k].pad_from, pad));
			CHECK(cudaHostAlloc(&side[k].pad_to, pad, cudaHostAllocMapped));
		}
	}
	cudaStream_t busy[2];
	void *busy_device = 0, *busy_host = 0;
	int loads_link = background && first_side == 0;
	if (loads_link) {
		CHECK(cudaMalloc(&busy_device, 2 * background));
		CHECK(cudaHostAlloc(&busy_host, 2 * background, cudaHostAllocMapped));
		for (int k = 0; k < 2; k++)
			CHECK(cudaStreamCreateWithFlags(&busy[k], cudaStreamNonBlocking));
	}
	/* Two rounds: the first warms up, the second is timed. */
	double per_round_trip = 0;
	for (int round = 0; round < 2; round++) {
		/* Enough copies to outlast the round trips at any link rate. */
		for (int j = 0; loads_link && j < 400; j++) {
			CHECK(cudaMemcpyAsync(busy_host, busy_device, background, cudaMemcpyDeviceToHost, busy[0]));
			CHECK(cudaMemcpyAsync((char *)busy_device + background, (char *)busy_host + background,
					      background, cudaMemcpyHostToDevice, busy[1]));
		}
		double started = now_us();
		for (int k = 0; k < sides; k++)
			queue_side(&side[k], flags, first_side + k, (u64)round * round_trips + 1,
				   (u64)(round + 1) * round_trips);
		for (int k = 0; k < sides; k++)
			CHECK(cudaStreamSynchronize(side[k].stream));
		per_round_trip = (now_us() - started) / round_trips;
		for (int k = 0; loads_link && k < 2; k++)
			CHECK(cudaStreamSynchronize(busy[k]));
	}
	int failed;
	CHECK(cudaMemcpy(&failed, timed_out, sizeof(int), cudaMemcpyDeviceToHost));
	if (failed) {
		fprintf(stderr, "%s: a wait timed out\n", argv[1]);
		return 1;
	}
	if (first_side == 0)
		printf("%s procs %d pad %zu background %zu: %.2f us per round trip\n", argv[1], procs, pad,
		       background, per_round_trip);
	return 0;
}
