// SPDX-License-Identifier: GPL-2.0
/*
 * One-line wrappers of static inline kernel functions that the Rust side of
 * pcieipc.ko needs and bindgen cannot bind (see rust/helpers/ in the kernel).
 */
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/vmalloc.h>

pgprot_t pcieipc_pgprot_noncached(pgprot_t prot);

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
