/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * pcieipc: the ABI of /dev/pcieipc.
 *
 * This header is the one definition of the ABI. Userspace and the module use
 * the bindgen output of it (userspace/uapi/src/generated.rs); the test command
 * regenerates that file and fails on any difference.
 *
 * Conventions, as in VFIO:
 *  - every ioctl takes a pointer to a struct whose first field is `argsz`: the
 *    size of the struct as the caller knows it. The module refuses an argsz
 *    smaller than the struct's size in the ABI version that introduced it
 *    (EINVAL) and never reads or writes past argsz, so structs can grow at the
 *    end without new ioctl numbers: fields an older caller does not send
 *    read as zero, and only argsz bytes are written back;
 *  - ioctl numbers are _IO(PCIEIPC_IOC_MAGIC, nr): the size lives in argsz;
 *  - `flags` fields must be zero unless a flag is defined (EINVAL otherwise);
 *  - padding and reserved fields are zero.
 */
#ifndef _UAPI_PCIEIPC_H
#define _UAPI_PCIEIPC_H

#include <linux/ioctl.h>
#include <linux/types.h>

/* The misc device's name: /dev/pcieipc. */
#define PCIEIPC_DEVICE_NAME "pcieipc"

/*
 * ABI version. The major number changes when an existing struct or ioctl
 * changes meaning; the minor number when something is added.
 */
#define PCIEIPC_ABI_MAJOR 0
#define PCIEIPC_ABI_MINOR 5

/* Free in Documentation/userspace-api/ioctl/ioctl-number.rst. */
#define PCIEIPC_IOC_MAGIC 0xD7

/* Command numbers (the `nr` of the ioctl). */
enum pcieipc_cmd {
	PCIEIPC_CMD_VERSION = 0x00,
	PCIEIPC_CMD_LIST = 0x01,
	PCIEIPC_CMD_WAIT = 0x02,
	PCIEIPC_CMD_COUNTERS = 0x03,
	PCIEIPC_CMD_RING = 0x04,
	PCIEIPC_CMD_DMA_ALLOC = 0x05,
	PCIEIPC_CMD_DMA_COPY = 0x06,
	PCIEIPC_CMD_DMA_WAIT = 0x07,
	/* The fault path. */
	PCIEIPC_CMD_LINK_STATUS = 0x20,
	PCIEIPC_CMD_LINK_RETRAIN = 0x21,
	PCIEIPC_CMD_WATCH = 0x22,
	PCIEIPC_CMD_RESET = 0x23,
};

/* Length of pcieipc_version.module_version, NUL included. */
#define PCIEIPC_VERSION_STRING_LEN 32

/*
 * PCIEIPC_IOC_VERSION: which ABI and module this is.
 * In: argsz, flags (0). Out: the rest.
 */
struct pcieipc_version {
	__u32 argsz;
	__u32 flags;
	__u16 abi_major;
	__u16 abi_minor;
	/* Devices the module is bound to right now. */
	__u32 bound_devices;
	/* The module's version string, NUL-terminated. */
	char module_version[PCIEIPC_VERSION_STRING_LEN];
	/* ABI 0.4: events emitted since the module was loaded (the seq of the
	 * next event). An ABI 0.3 caller's argsz (48) stops before it. */
	__u64 events_emitted;
};

#define PCIEIPC_IOC_VERSION _IO(PCIEIPC_IOC_MAGIC, PCIEIPC_CMD_VERSION)

/* BARs of a PCI function (standard BARs 0..5). */
#define PCIEIPC_NUM_BARS 6
/* Interrupt vectors the module allocates per device, at most. */
#define PCIEIPC_MAX_VECTORS 32

/*
 * mmap offsets, as VFIO's region offsets: the window of BAR `bar` of the
 * device of index `index` starts at PCIEIPC_MMAP_OFFSET(index, bar); add the
 * (page-aligned) offset inside the BAR. LIST reports the offset of every BAR.
 */
#define PCIEIPC_MMAP_BAR_SHIFT 40
#define PCIEIPC_MMAP_INDEX_SHIFT 44
#define PCIEIPC_MMAP_OFFSET(index, bar) \
	(((__u64)(index) << PCIEIPC_MMAP_INDEX_SHIFT) | ((__u64)(bar) << PCIEIPC_MMAP_BAR_SHIFT))

/* pcieipc_device_info.state */
enum pcieipc_device_state {
	PCIEIPC_STATE_BOUND = 0,
	/* A PCI error froze the device; waits fail with EIO. */
	PCIEIPC_STATE_FROZEN = 1,
	/* Unbound or removed; kept in the list until its BDF binds again. */
	PCIEIPC_STATE_GONE = 2,
};

/* pcieipc_device_info.kind: what the module knows how to drive. */
enum pcieipc_device_kind {
	/* Bound through new_id/driver_override: BARs and interrupts only. */
	PCIEIPC_KIND_GENERIC = 0,
	/* QEMU ivshmem-doorbell (1af4:1110): RING, BAR2 shared memory. */
	PCIEIPC_KIND_IVSHMEM = 1,
	/* QEMU edu (1234:11e8): a DMA engine. */
	PCIEIPC_KIND_EDU = 2,
};

/* pcieipc_device_info.irq_type */
enum pcieipc_irq_type {
	PCIEIPC_IRQ_NONE = 0,
	PCIEIPC_IRQ_INTX = 1,
	PCIEIPC_IRQ_MSI = 2,
	PCIEIPC_IRQ_MSIX = 3,
};

/* pcieipc_bar_info.flags */
#define PCIEIPC_BAR_MEM (1u << 0)
#define PCIEIPC_BAR_IO (1u << 1)
#define PCIEIPC_BAR_64BIT (1u << 2)
#define PCIEIPC_BAR_PREFETCH (1u << 3)
/* The BAR can be mapped with mmap: a memory BAR of at least one page that
 * holds neither the MSI-X table nor its pending bits, nor the registers that
 * the module drives itself (BAR0 of ivshmem-doorbell and edu). */
#define PCIEIPC_BAR_MMAP (1u << 4)

struct pcieipc_bar_info {
	__u64 size;
	/* PCIEIPC_MMAP_OFFSET(index, bar) */
	__u64 mmap_offset;
	__u32 flags;
	__u32 reserved;
};

/* pcieipc_device_info.peer_id of a device without one. */
#define PCIEIPC_NO_PEER_ID 0xffffffffu

/*
 * A PCI function: PCIEIPC_BDF(domain, bus, devfn) as lspci prints
 * dddd:bb:dd.f, with devfn = device << 3 | function. The domain has 16 bits:
 * functions in domains above 0xffff (VMD's) cannot be named; the module does
 * not bind them, and userspace refuses to encode them.
 */
#define PCIEIPC_BDF(domain, bus, devfn) \
	((((__u32)(domain)) << 16) | (((__u32)(bus)) << 8) | ((__u32)(devfn)))
/* No such function: no upstream bridge (a device on a root bus), no device. */
#define PCIEIPC_BDF_NONE 0xffffffffU

/* One bound device. */
struct pcieipc_device_info {
	/* The handle that every other ioctl takes; never reused while loaded. */
	__u32 index;
	__u32 state;
	/* domain << 16 | bus << 8 | devfn */
	__u32 bdf;
	/* The upstream bridge's BDF, or PCIEIPC_BDF_NONE. */
	__u32 upstream_bdf;
	__u16 vendor;
	__u16 device;
	/* class << 16 | subclass << 8 | prog-if */
	__u32 class_code;
	__u32 kind;
	__u32 irq_type;
	/* Interrupt vectors with a counter: WAIT's `vector` is below this.
	 * 0 for a device without interrupts (bound through driver_override). */
	__u32 num_vectors;
	/* Of the link above the device (the upstream port's LNKSTA):
	 * speed code 1 = 2.5 GT/s, 2 = 5, 3 = 8, 4 = 16, 5 = 32, 6 = 64;
	 * 0 when unknown. */
	__u16 link_speed;
	__u16 link_width;
	/* ivshmem-doorbell: the device's own peer id (IVPosition), which peers
	 * pass to RING; PCIEIPC_NO_PEER_ID for other kinds. */
	__u32 peer_id;
	__u32 reserved;
	struct pcieipc_bar_info bars[PCIEIPC_NUM_BARS];
};

/*
 * PCIEIPC_IOC_LIST: the bound devices (and gone ones not yet replaced).
 * In: argsz, flags (0), entry_size = sizeof(struct pcieipc_device_info),
 * capacity = entries the array at `entries` holds. Out: count = devices
 * known (may exceed capacity: only the first `capacity` are written).
 */
struct pcieipc_list {
	__u32 argsz;
	__u32 flags;
	__u32 entry_size;
	__u32 capacity;
	__u32 count;
	__u32 reserved;
	/* user pointer to struct pcieipc_device_info[capacity] */
	__u64 entries;
};

#define PCIEIPC_IOC_LIST _IO(PCIEIPC_IOC_MAGIC, PCIEIPC_CMD_LIST)

/* pcieipc_wait.timeout_ms: no timeout. */
#define PCIEIPC_WAIT_FOREVER 0xffffffffu

/*
 * PCIEIPC_IOC_WAIT: block until the interrupt count of (device, vector)
 * exceeds last_seen. In: argsz, flags (0), device, vector, last_seen,
 * timeout_ms (0: do not block). Out: count, the vector's count now.
 * Errors: ETIMEDOUT, EINTR (a signal; call again with the same arguments),
 * ENODEV (device gone, also while waiting), EIO (a PCI error was reported
 * for the device during the wait, or it is still frozen by one: AER
 * recovery in progress), ENOENT (no such device index), EINVAL (vector out
 * of range).
 */
struct pcieipc_wait {
	__u32 argsz;
	__u32 flags;
	__u32 device;
	__u32 vector;
	__u64 last_seen;
	__u32 timeout_ms;
	__u32 reserved;
	__u64 count;
};

#define PCIEIPC_IOC_WAIT _IO(PCIEIPC_IOC_MAGIC, PCIEIPC_CMD_WAIT)

/*
 * PCIEIPC_IOC_COUNTERS: every vector's interrupt count, without waiting.
 * In: argsz, flags (0), device. Out: num_vectors, counts[0..num_vectors].
 */
struct pcieipc_counters {
	__u32 argsz;
	__u32 flags;
	__u32 device;
	__u32 num_vectors;
	__u64 counts[PCIEIPC_MAX_VECTORS];
};

#define PCIEIPC_IOC_COUNTERS _IO(PCIEIPC_IOC_MAGIC, PCIEIPC_CMD_COUNTERS)

/*
 * PCIEIPC_IOC_RING: ring a doorbell: ivshmem-doorbell writes
 * (peer << 16) | vector to its Doorbell register, raising `vector` of peer
 * `peer` (its IVPosition). Needs CAP_SYS_ADMIN. Errors: EOPNOTSUPP (the
 * device has no doorbell), ENODEV, ENOENT, EPERM.
 */
struct pcieipc_ring {
	__u32 argsz;
	__u32 flags;
	__u32 device;
	__u16 peer;
	__u16 vector;
};

#define PCIEIPC_IOC_RING _IO(PCIEIPC_IOC_MAGIC, PCIEIPC_CMD_RING)

/*
 * mmap offset of DMA buffer `buffer` (a handle of DMA_ALLOC):
 * PCIEIPC_MMAP_DMA | (buffer << PCIEIPC_MMAP_BAR_SHIFT) | offset_in_buffer.
 * DMA_ALLOC reports it. Only the file that allocated a buffer maps it;
 * handles are never reused while the module is loaded.
 */
#define PCIEIPC_MMAP_DMA (1ull << 62)

/* Largest DMA buffer, and buffers per open file. */
#define PCIEIPC_DMA_MAX_SIZE (16u << 20)
#define PCIEIPC_DMA_MAX_BUFFERS 64

/*
 * PCIEIPC_IOC_DMA_ALLOC: a coherent DMA buffer for device `device`, zeroed,
 * owned by this open file: freed when the file is released, or when the
 * device goes (unbind, removal, a permanent error) after its mappings are
 * zapped (a later access maps the module's stand-in page, a zeroed page of
 * its own), so a mapping never outlives its memory. Needs CAP_SYS_ADMIN. In: argsz, flags (0), device, size (> 0, <=
 * PCIEIPC_DMA_MAX_SIZE; rounded up to pages). Out: buffer (handle), size,
 * bus_addr (the address the device uses), mmap_offset.
 * Errors: ENOSPC (PCIEIPC_DMA_MAX_BUFFERS reached, or the module's 2^22
 * handles used up), ENOMEM, ENODEV, ENOENT,
 * EINVAL, EPERM.
 */
struct pcieipc_dma_alloc {
	__u32 argsz;
	__u32 flags;
	__u32 device;
	__u32 buffer;
	__u64 size;
	__u64 bus_addr;
	__u64 mmap_offset;
};

#define PCIEIPC_IOC_DMA_ALLOC _IO(PCIEIPC_IOC_MAGIC, PCIEIPC_CMD_DMA_ALLOC)

/* pcieipc_dma_copy.flags */
#define PCIEIPC_DMA_SRC_BAR (1u << 0)
#define PCIEIPC_DMA_DST_BAR (1u << 1)
/* BAR windows larger than this are not mapped into the kernel for copies. */
#define PCIEIPC_DMA_BAR_MAX_SIZE (64u << 20)

/* pcieipc_dma_copy.engine: who executes a copy. */
enum pcieipc_dma_engine {
	/* A CPU copy in the submitting thread: devices without a DMA engine. */
	PCIEIPC_ENGINE_CPU = 1,
	/* edu's DMA engine, through its 4 KiB window, one chunk per interrupt. */
	PCIEIPC_ENGINE_EDU = 2,
};

/*
 * PCIEIPC_IOC_DMA_COPY: copy `length` bytes from buffer `src_buffer` at
 * `src_offset` to buffer `dst_buffer` at `dst_offset`, both buffers of this
 * file allocated for `device`, with that device's engine. With flag
 * PCIEIPC_DMA_SRC_BAR (or PCIEIPC_DMA_DST_BAR), `src_buffer` (`dst_buffer`)
 * names instead a BAR window of `device` (a BAR with PCIEIPC_BAR_MMAP, of
 * at most PCIEIPC_DMA_BAR_MAX_SIZE), copied by the CPU; not both. Needs
 * CAP_SYS_ADMIN. Out: engine, ticket (for DMA_WAIT). The buffers stay
 * allocated until the copy ends even if the file is closed.
 * Errors: EBUSY (the engine runs another copy: wait for its ticket first;
 * or 64 tickets of this file are not collected yet),
 * ENOENT (no such buffer or device), EINVAL (ranges past a buffer's end,
 * length 0, buffers of another device), ENODEV, EPERM.
 */
struct pcieipc_dma_copy {
	__u32 argsz;
	__u32 flags;
	__u32 device;
	__u32 src_buffer;
	__u32 dst_buffer;
	__u32 engine;
	__u64 src_offset;
	__u64 dst_offset;
	__u64 length;
	__u64 ticket;
};

#define PCIEIPC_IOC_DMA_COPY _IO(PCIEIPC_IOC_MAGIC, PCIEIPC_CMD_DMA_COPY)

/*
 * PCIEIPC_IOC_DMA_WAIT: block (interrupt-driven) until the copy of `ticket`
 * ends. Returns 0 when it completed, or the copy's own error (ENODEV: the
 * device went away before the copy ended). A ticket is collected by the
 * first wait that sees it end. Other
 * errors: ETIMEDOUT (still running), EINTR, ENOENT (unknown or collected
 * ticket), EINVAL.
 */
struct pcieipc_dma_wait {
	__u32 argsz;
	__u32 flags;
	__u64 ticket;
	__u32 timeout_ms;
	__u32 reserved;
};

#define PCIEIPC_IOC_DMA_WAIT _IO(PCIEIPC_IOC_MAGIC, PCIEIPC_CMD_DMA_WAIT)

/* ---- Fault path: link status and control, watches, events ---- */

/* The link registers of one end of a link (PCI Express capability). */
struct pcieipc_link_regs {
	__u32 lnkcap;   /* Link Capabilities */
	__u16 lnkctl;   /* Link Control */
	__u16 lnksta;   /* Link Status */
	__u16 lnkctl2;  /* Link Control 2 (target link speed) */
	__u16 present;  /* 1 if the function has a PCI Express capability */
};

/* pcieipc_link_status.state bits. */
#define PCIEIPC_LINK_DEGRADED (1U << 0)      /* below capability or target */
#define PCIEIPC_LINK_TRAINING (1U << 1)      /* LnkSta.LT set */
#define PCIEIPC_LINK_DLL_ACTIVE (1U << 2)    /* LnkSta.DLLLA set (if reported) */

/*
 * PCIEIPC_IOC_LINK_STATUS: the link above any PCI function, owned by this
 * module or not. The link is read at both ends: the function itself (if it
 * is PCI Express) and its upstream port (the downstream-facing end).
 * Speeds are generations (1 = 2.5 GT/s ... 6 = 64 GT/s), 0 = unknown.
 * In: argsz, flags (0), bdf. Out: the rest.
 */
struct pcieipc_link_status {
	__u32 argsz;
	__u32 flags;
	__u32 bdf;
	__u32 upstream_bdf;        /* PCIEIPC_BDF_NONE: on a root bus */
	struct pcieipc_link_regs device;
	struct pcieipc_link_regs port;  /* the upstream port's registers */
	__u8 cur_speed;            /* from the port's LnkSta */
	__u8 cur_width;
	__u8 max_speed;            /* lower of both ends' LnkCap */
	__u8 max_width;
	__u8 target_speed;         /* the port's LnkCtl2 target */
	__u8 reserved[3];
	__u32 state;               /* PCIEIPC_LINK_* */
};

/* pcieipc_link_retrain.target_speed: the highest speed both ends support. */
#define PCIEIPC_LINK_SPEED_MAX 0xff

/* pcieipc_link_retrain.refused: why a retrain was refused (ABI 0.5). */
enum pcieipc_link_refusal {
	PCIEIPC_LINK_REFUSED_NONE = 0,
	/*
	 * EACCES: no device this module binds hangs from the port, and root
	 * did not list `bdf` in the module parameter link_control.
	 */
	PCIEIPC_LINK_REFUSED_NOT_ALLOWED = 1,
	/*
	 * EACCES: listed, but a mass-storage function (refused_bdf) is at or
	 * below the port: its link is never taken down.
	 */
	PCIEIPC_LINK_REFUSED_STORAGE = 2,
	/*
	 * EBUSY: a target speed on a port whose speed the kernel's bandwidth
	 * controller sets (its thermal cooling device): change it there.
	 */
	PCIEIPC_LINK_REFUSED_BANDWIDTH_CONTROLLER = 3,
};

/*
 * PCIEIPC_IOC_LINK_RETRAIN (CAP_SYS_ADMIN): retrains the link above `bdf`
 * from its upstream port: optionally sets the target speed (LnkCtl2) for
 * this retrain, sets Retrain Link, waits up to timeout_ms (0: 1000, as the
 * kernel does) for Link Training to clear, then puts the port's Target Link
 * Speed back as it was. Retrains are serialised (two at once run one after
 * the other). Only the link above a device this module binds, or one root
 * listed in the module parameter link_control, is retrained.
 * Emits a PCIEIPC_EVENT_LINK_RETRAIN event.
 * Errors: ENODEV (no such function), EOPNOTSUPP (no upstream
 * PCI Express port), ETIMEDOUT (training did not end; `after` is filled),
 * EPERM (no CAP_SYS_ADMIN, or the kernel is locked down), EACCES and EBUSY
 * (`refused` says why), EINVAL (flags, target_speed above the port's
 * capability).
 */
struct pcieipc_link_retrain {
	__u32 argsz;
	__u32 flags;
	__u32 bdf;
	__u32 timeout_ms;
	__u8 target_speed;         /* 0: keep; 1..6; PCIEIPC_LINK_SPEED_MAX */
	__u8 reserved[3];
	__u32 elapsed_us;          /* out: time until training ended */
	struct pcieipc_link_status before;  /* out */
	struct pcieipc_link_status after;   /* out */
	/* ABI 0.5 */
	__u32 refused;             /* out, with EACCES/EBUSY: pcieipc_link_refusal */
	__u32 refused_bdf;         /* out: the function that made it refuse */
};

/* pcieipc_watch.flags */
#define PCIEIPC_WATCH_ADD (1U << 0)
#define PCIEIPC_WATCH_REMOVE (1U << 1)

/*
 * PCIEIPC_IOC_WATCH (CAP_SYS_ADMIN): watches a PCI function by BDF: every
 * period_ms (10..60000) the link status of its upstream port and a config
 * space heartbeat (vendor/device id) are read; a change emits
 * PCIEIPC_EVENT_LINK_CHANGE, reads of all ones emit PCIEIPC_EVENT_DEVICE_GONE
 * (once; the watch ends). Exactly one of ADD or REMOVE in flags.
 * Errors: ENODEV, EEXIST (already watched), ENOENT (not watched), EINVAL, ENOSPC.
 */
struct pcieipc_watch {
	__u32 argsz;
	__u32 flags;
	__u32 bdf;
	__u32 period_ms;
};

/*
 * PCIEIPC_IOC_RESET (CAP_SYS_ADMIN): resets a bound device (`device` as in
 * LIST) with the kernel's function reset, which saves the config space,
 * resets by the best method the device offers (FLR, PM, or a secondary bus
 * reset of a port it sits alone under) and restores it. The device reads as
 * frozen meanwhile (waiters wake with EIO); a PCIEIPC_EVENT_RESET is emitted
 * with the result. Errors: ENOENT, ENODEV (gone), ENOTTY (no reset method),
 * EPERM, EINVAL.
 */
struct pcieipc_reset {
	__u32 argsz;
	__u32 flags;
	__u32 device;
	__u32 elapsed_us;  /* out */
};

#define PCIEIPC_IOC_LINK_STATUS _IO(PCIEIPC_IOC_MAGIC, PCIEIPC_CMD_LINK_STATUS)
#define PCIEIPC_IOC_LINK_RETRAIN _IO(PCIEIPC_IOC_MAGIC, PCIEIPC_CMD_LINK_RETRAIN)
#define PCIEIPC_IOC_WATCH _IO(PCIEIPC_IOC_MAGIC, PCIEIPC_CMD_WATCH)
#define PCIEIPC_IOC_RESET _IO(PCIEIPC_IOC_MAGIC, PCIEIPC_CMD_RESET)

/* ---- Events: read() on /dev/pcieipc returns whole struct pcieipc_event ---- */

/*
 * The module keeps the newest PCIEIPC_EVENT_RING_CAPACITY events. Each open
 * file has its own cursor, starting at the oldest event kept. read() takes a
 * buffer of one or more whole records (EINVAL otherwise) and blocks until an
 * event is there (EAGAIN with O_NONBLOCK); poll() reports POLLIN then.
 */
#define PCIEIPC_EVENT_RING_CAPACITY 256

enum pcieipc_event_kind {
	/* The reader fell behind: `lost` events were dropped before the next one. */
	PCIEIPC_EVENT_OVERFLOW = 1,
	/* An AER callback ran; `aer_step` says which, `aer` holds the registers. */
	PCIEIPC_EVENT_AER = 2,
	/* Speed, width or Data Link Layer Link Active changed (watch). */
	PCIEIPC_EVENT_LINK_CHANGE = 3,
	/* Config reads return all ones (watch), or a bound device is leaving
	 * (unbind, hot-unplug, a permanent error, unload; link_before/link_after
	 * are then zero), queued before its windows are zapped. */
	PCIEIPC_EVENT_DEVICE_GONE = 4,
	/* PCIEIPC_IOC_LINK_RETRAIN ran. */
	PCIEIPC_EVENT_LINK_RETRAIN = 5,
	/* A function reset ran. */
	PCIEIPC_EVENT_RESET = 6,
};

/* pcieipc_event.aer_step: which AER callback, i.e. where recovery stands. */
enum pcieipc_aer_step {
	PCIEIPC_AER_NONE = 0,
	PCIEIPC_AER_COR_ERROR_DETECTED = 1,
	PCIEIPC_AER_ERROR_DETECTED = 2,
	PCIEIPC_AER_MMIO_ENABLED = 3,
	PCIEIPC_AER_SLOT_RESET = 4,
	PCIEIPC_AER_RESUME = 5,
};

/* The AER extended capability's registers at the time of the event. */
struct pcieipc_aer_regs {
	__u32 uncor_status;
	__u32 uncor_mask;
	__u32 uncor_severity;
	__u32 cor_status;
	__u32 cor_mask;
	__u32 cap_control;
	__u32 header_log[4];
	__u32 present;   /* 1 if the function has an AER capability */
	__u32 source_bdf; /* the function the registers were read from */
};

/*
 * One event. `seq` counts every event the module emitted since it was
 * loaded; a reader sees them in order, and never a silent gap: when its
 * cursor fell out of the ring it first reads a PCIEIPC_EVENT_OVERFLOW with
 * the exact number lost.
 */
struct pcieipc_event {
	__u64 seq;
	__u64 timestamp_ns;     /* CLOCK_MONOTONIC */
	__u32 kind;             /* enum pcieipc_event_kind */
	__u32 bdf;
	__u64 lost;             /* OVERFLOW: events dropped */
	__u32 aer_step;         /* AER: enum pcieipc_aer_step */
	__u32 channel_state;    /* AER: pci_channel_state (1 normal, 2 frozen, 3 permanent failure) */
	__u32 result;           /* AER: the pci_ers_result the driver returned; RETRAIN/RESET: errno (0 ok) */
	__u32 reserved;
	struct pcieipc_aer_regs aer;
	struct pcieipc_link_status link_before;  /* LINK_*: the link before */
	struct pcieipc_link_status link_after;   /* LINK_*: and after */
};

#endif /* _UAPI_PCIEIPC_H */
