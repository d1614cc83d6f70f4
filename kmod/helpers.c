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

vm_fault_t pcieipc_insert_ram_page(void *vma, unsigned long address,
				   void *page);

/*
 * Maps a RAM page of the module's at a faulting address of a VM_PFNMAP
 * mapping, with the mapping's own protection minus its caching bits: the
 * mapping may be of uncached device memory, but RAM the kernel maps cached
 * must not also be mapped uncached.
 */
vm_fault_t pcieipc_insert_ram_page(void *vma, unsigned long address,
				   void *page)
{
	struct vm_area_struct *area = vma;
	struct page *ram = page;

	return vmf_insert_pfn_prot(area, address, page_to_pfn(ram),
				   vm_get_page_prot(area->vm_flags));
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
