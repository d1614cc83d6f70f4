// SPDX-License-Identifier: GPL-2.0
/*
 * One-line wrappers of static inline kernel functions that the Rust side of
 * pcieipc.ko needs and bindgen cannot bind (see rust/helpers/ in the kernel).
 */
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/security.h>
#include <linux/vmalloc.h>

pgprot_t pcieipc_pgprot_noncached(pgprot_t prot);
int pcieipc_locked_down_pci(void);

/* The uncached page protection for a BAR mapped into userspace. */
pgprot_t pcieipc_pgprot_noncached(pgprot_t prot)
{
	return pgprot_noncached(prot);
}

unsigned long pcieipc_kernel_address_pfn(const void *addr);

/*
 * The page frame behind a kernel address that dma_alloc_attrs returned:
 * in the linear map, or vmap'ed (remapped coherent memory, IOMMU).
 */
unsigned long pcieipc_kernel_address_pfn(const void *addr)
{
	if (is_vmalloc_addr(addr))
		return vmalloc_to_pfn(addr);
	return PHYS_PFN(virt_to_phys((void *)addr));
}

/*
 * Whether the kernel lockdown forbids raw PCI access (0: allowed), as sysfs
 * config writes and resource mmaps check it. A static inline returning 0
 * without CONFIG_SECURITY.
 */
int pcieipc_locked_down_pci(void)
{
	return security_locked_down(LOCKDOWN_PCI_ACCESS);
}
