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
 *    end without new ioctl numbers;
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
#define PCIEIPC_ABI_MINOR 1

/* Free in Documentation/userspace-api/ioctl/ioctl-number.rst. */
#define PCIEIPC_IOC_MAGIC 0xD7

/* Command numbers (the `nr` of the ioctl). */
enum pcieipc_cmd {
	PCIEIPC_CMD_VERSION = 0x00,
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
};

#define PCIEIPC_IOC_VERSION _IO(PCIEIPC_IOC_MAGIC, PCIEIPC_CMD_VERSION)

#endif /* _UAPI_PCIEIPC_H */
