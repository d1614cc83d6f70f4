# What the scripts comparing pcieipc with OpenMPI on this host share
# (bench-vs-mpi.sh, cold-start-vs-mpi.sh, latency-vs-mpi.sh); sourced, never run. Expects
# PCIEIPC and KEEP set (empty for their defaults) and the repository root as
# the working directory.

# The tools all of them need, cargo where PCIEIPC does not name a build, and
# PCIEIPC an executable where it does: said before anything is built or run.
script_name=$(basename "$0" .sh)
for tool in mpicc gcc mpirun python3 $([ -n "$PCIEIPC" ] || echo cargo); do
    command -v "$tool" >/dev/null || { echo "$script_name: $tool is missing (see the header)" >&2; exit 1; }
done
if [ -n "$PCIEIPC" ] && [ ! -x "$PCIEIPC" ]; then
    echo "$script_name: PCIEIPC=$PCIEIPC is not an executable pcieipc binary" >&2
    exit 1
fi

# A work directory ($work), copied to KEEP however the script ends (a failing
# run's samples are the ones worth reading), then removed.
work=$(mktemp -d)
trap '[ -z "$KEEP" ] || { mkdir -p "$KEEP" && cp -r "$work"/. "$KEEP"/; }; rm -rf "$work"' EXIT

# $pcieipc: PCIEIPC, or this tree's, built; $mpi_bench: OpenMPI's side, built
# into $work.
if [ -n "$PCIEIPC" ]; then
    pcieipc=$PCIEIPC
else
    cargo build --release -q -p pcieipc-cli
    target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    pcieipc="$target_dir/release/pcieipc"
fi
mpi_bench="$work/mpi_allreduce"
mpicc -O2 -o "$mpi_bench" bench/mpi_allreduce.c

# mpi ARGS...: the MPI program on 2 ranks. Running as root needs OpenMPI's
# explicit consent; vader is its shared-memory transport (self for a rank
# talking to itself).
mpi() {
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        mpirun --oversubscribe -np 2 --mca btl self,vader "$mpi_bench" "$@"
}
