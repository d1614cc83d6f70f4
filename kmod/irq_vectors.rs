// SPDX-License-Identifier: GPL-2.0

//! Interrupt vectors kept in driver data: the vector allocation and one
//! handler registration per vector, stored together.
//!
//! 7.3's `irq::Registration` borrows an `IrqVector`, which borrows the
//! `IrqVectorRegistration`: storing both in one struct is self-referential.
//! This wrapper boxes the allocation (a stable address), hands the handler
//! registrations a reference to it with the device's bound lifetime, and
//! drops the handlers (`free_irq`) before the allocation
//! (`pci_free_irq_vectors`), as the kernel requires.

use kernel::{
    device::Bound,
    irq::{self, Flags},
    pci::{self, IrqType, IrqTypes, IrqVectorRegistration},
    prelude::*,
};

use crate::uapi;

pub(crate) struct IrqVectors<'bound, H: irq::Handler + 'bound> {
    /// Declared first, so dropped first: each borrows `allocation`.
    handlers: KVec<Pin<KBox<irq::Registration<'bound, H>>>>,
    allocation: KBox<IrqVectorRegistration<'bound>>,
}

impl<'bound, H: irq::Handler + 'bound> IrqVectors<'bound, H> {
    /// Allocates up to `max` vectors: MSI-X, else MSI, else legacy INTx.
    pub(crate) fn allocate(pdev: &'bound pci::Device<Bound>, max: u32) -> Result<Self> {
        let allocation = pdev.alloc_irq_vectors(1, max, IrqTypes::all())?;
        Ok(Self {
            handlers: KVec::new(),
            allocation: KBox::new(allocation, GFP_KERNEL)?,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.allocation.len()
    }

    /// `pcieipc_irq_type` of the allocation.
    pub(crate) fn irq_type(&self) -> u32 {
        match self.allocation.irq_type() {
            IrqType::MsiX => uapi::PCIEIPC_IRQ_MSIX,
            IrqType::Msi => uapi::PCIEIPC_IRQ_MSI,
            IrqType::Intx => uapi::PCIEIPC_IRQ_INTX,
        }
    }

    /// Installs `handler(i)` on every vector `i`.
    pub(crate) fn request_all(&mut self, handler: impl Fn(usize) -> H) -> Result {
        // SAFETY: `allocation` is boxed, so its address does not change when
        // `self` moves, and it is freed only when `self` drops, after every
        // registration in `handlers` (field order, and `Drop` below empties
        // `handlers` first). The reference never leaves this struct except
        // inside those registrations, so it never outlives the allocation,
        // which itself lives no longer than the device is bound ('bound).
        let allocation: &'bound IrqVectorRegistration<'bound> =
            unsafe { &*core::ptr::from_ref(&*self.allocation) };
        for index in 0..allocation.len() {
            let vector = allocation.index(index)?;
            // SAFETY: the registration is pinned in a box that `handlers`
            // owns and drops; it is never forgotten.
            let registration = unsafe {
                irq::Registration::new(
                    vector.into(),
                    Flags::SHARED,
                    c"pcieipc",
                    Ok::<H, Error>(handler(index)),
                )
            };
            self.handlers
                .push(KBox::pin_init(registration, GFP_KERNEL)?, GFP_KERNEL)?;
        }
        Ok(())
    }
}

impl<H: irq::Handler> Drop for IrqVectors<'_, H> {
    fn drop(&mut self) {
        // Free the IRQs before the vector allocation is released.
        self.handlers.clear();
    }
}
