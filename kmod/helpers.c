// SPDX-License-Identifier: GPL-2.0
/*
 * One-line wrappers of static inline kernel functions that the Rust side of
 * pcieipc.ko needs and bindgen cannot bind (see rust/helpers/ in the kernel).
 */
#include <linux/mm.h>

pgprot_t pcieipc_pgprot_noncached(pgprot_t prot);

/* The uncached page protection for a BAR mapped into userspace. */
pgprot_t pcieipc_pgprot_noncached(pgprot_t prot)
{
	return pgprot_noncached(prot);
}
