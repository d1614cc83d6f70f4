# Thin wrappers over scripts/; see README.md.
.PHONY: all build run test test-gpu testbed uapi kmod clean-kmod deb dist distro-kmod

all: build

# Host prerequisites, the testbed kernel (cached), the module, userspace.
build:
	bash scripts/build-all.sh

# The main job.
run:
	bash scripts/run.sh

# All tests (what CI runs).
test:
	bash scripts/test.sh

# One topology file + guest script by hand:
#   make testbed TOPO=tests/topologies/fabric.toml GUEST=tests/guest/tree.sh [HOST=tests/host/x.sh]
testbed:
	@test -n "$(TOPO)" -a -n "$(GUEST)" || { echo "usage: make testbed TOPO=FILE GUEST=SCRIPT [HOST=SCRIPT]"; exit 2; }
	bash scripts/testbed.sh "$(TOPO)" "$(GUEST)" $(HOST)

# Regenerate userspace/uapi/src/generated.rs after editing include/uapi/pcieipc.h.
uapi:
	bash scripts/gen-uapi.sh

# Rebuild only the module (after build has run once).
kmod:
	. build/env.sh && $(MAKE) -C "$$PCIEIPC_KERNEL_BUILD" M=$(CURDIR) LLVM= modules

clean-kmod:
	. build/env.sh && $(MAKE) -C "$$PCIEIPC_KERNEL_BUILD" M=$(CURDIR) LLVM= clean

# The GPU tests (need a GPU; never part of `make test`). On a GPU machine
# without cargo: `scripts/test-gpu.sh build DIR` here, copy DIR, then
# `scripts/test-gpu.sh run DIR` there.
test-gpu:
	bash scripts/test-gpu.sh

# The DKMS package: build/deb/pcieipc-dkms_<version>_all.deb (README: Install on your server).
deb:
	bash scripts/build-deb.sh

# What a server installs without cargo, into build/dist/: the manylinux wheel (Python package
# and the pcieipc command), pcieipc_<version>_amd64.deb (the tools) and the DKMS package.
dist:
	bash scripts/build-dist.sh

# pcieipc.ko for Debian's packaged kernel, in a trixie chroot: make distro-kmod [RELEASE=7.3.4+deb13-amd64]
distro-kmod:
	bash scripts/distro-kmod.sh $(RELEASE)
