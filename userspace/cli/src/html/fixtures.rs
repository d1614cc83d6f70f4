//! The probe reports of the sysfs fixtures, for the page's tests.

use std::path::{Path, PathBuf};

use pcieipc::plan::CostModel;
use pcieipc::probe::{HealthModel, ProbeReport, Topology};

pub(crate) fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/sysfs")
        .join(name)
}

pub(crate) fn report_of(name: &str) -> ProbeReport {
    let topology = Topology::from_sysfs_root(&fixture(name), HealthModel::default()).unwrap();
    ProbeReport::new(&topology, &CostModel::default())
}

pub(crate) fn dgx8_report() -> ProbeReport {
    report_of("dgx8")
}
