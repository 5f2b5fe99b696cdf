//! Instance shapes from `DescribeInstanceTypes`: what each type has, read field by field, with one odd
//! entry dropped rather than the whole catalog.

use std::collections::{BTreeSet, HashMap};

use aws_sdk_ec2::types as ec2;
use tenon_core::cloud::CloudError;

use super::catalog::{Accelerator, Gpu, Shape};
use super::provider::NAME;

pub(super) fn kube_arch(ec2_arch: &str) -> Option<&'static str> {
    match ec2_arch {
        "x86_64" | "x86_64_mac" => Some("amd64"),
        "arm64" | "arm64_mac" => Some("arm64"),
        _ => None,
    }
}

/// The shapes of `infos`, by name. An entry that cannot be read (a field EC2 always sends is missing) is
/// dropped with its reason logged: one odd type never takes the whole catalog down.
pub fn shapes_of(infos: &[ec2::InstanceTypeInfo]) -> HashMap<String, Shape> {
    let mut out = HashMap::new();
    for info in infos {
        match shape_of(info) {
            Ok(Some(s)) => {
                out.insert(s.name.clone(), s);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "dropping an instance type DescribeInstanceTypes describes incompletely")
            }
        }
    }
    out
}

/// A shape from one `DescribeInstanceTypes` entry; `None` for types tenon cannot run (no supported
/// architecture, no HVM).
pub fn shape_of(info: &ec2::InstanceTypeInfo) -> Result<Option<Shape>, CloudError> {
    let name = info
        .instance_type()
        .map(|t| t.as_str().to_owned())
        .ok_or_else(|| CloudError::message(NAME, "DescribeInstanceTypes: an entry has no InstanceType"))?;
    let missing = |field: &str| CloudError::message(NAME, format!("DescribeInstanceTypes: {name}: no {field}"));
    let architectures: Vec<String> = info
        .processor_info()
        .map(|p| p.supported_architectures())
        .unwrap_or_default()
        .iter()
        .filter_map(|a| kube_arch(a.as_str()))
        .map(str::to_owned)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let hvm = info.supported_virtualization_types().is_empty()
        || info.supported_virtualization_types().contains(&ec2::VirtualizationType::Hvm);
    if architectures.is_empty() || !hvm {
        return Ok(None);
    }
    let vcpu = info.v_cpu_info().and_then(|v| v.default_v_cpus()).ok_or_else(|| missing("VCpuInfo.DefaultVCpus"))?;
    let memory_mib = info.memory_info().and_then(|m| m.size_in_mib()).ok_or_else(|| missing("MemoryInfo.SizeInMiB"))?;
    let net = info.network_info().ok_or_else(|| missing("NetworkInfo"))?;
    // The VPC CNI uses the interfaces of the default network card (p4d.24xlarge: 15 of its 60).
    let default_card = net.default_network_card_index().unwrap_or(0);
    let max_enis = net
        .network_cards()
        .iter()
        .find(|c| c.network_card_index() == Some(default_card))
        .and_then(|c| c.maximum_network_interfaces())
        .or(net.maximum_network_interfaces())
        .ok_or_else(|| missing("NetworkInfo.MaximumNetworkInterfaces"))?;
    let ipv4 = net.ipv4_addresses_per_interface().ok_or_else(|| missing("NetworkInfo.Ipv4AddressesPerInterface"))?;
    let mut gpus = Vec::new();
    for g in info.gpu_info().map(|g| g.gpus()).unwrap_or_default() {
        gpus.push(Gpu {
            name: g.name().ok_or_else(|| missing("GpuInfo.Gpus[].Name"))?.to_owned(),
            manufacturer: g.manufacturer().ok_or_else(|| missing("GpuInfo.Gpus[].Manufacturer"))?.to_owned(),
            count: i64::from(g.count().ok_or_else(|| missing("GpuInfo.Gpus[].Count"))?),
            memory_mib: i64::from(g.memory_info().and_then(|m| m.size_in_mib()).unwrap_or(0)),
        });
    }
    Ok(Some(Shape {
        name,
        vcpu: i64::from(vcpu),
        memory_mib,
        architectures,
        gpus,
        max_enis: i64::from(max_enis),
        ipv4_per_eni: i64::from(ipv4),
        hypervisor: info.hypervisor().map(|h| h.as_str().to_owned()).unwrap_or_default(),
        bare_metal: info.bare_metal().unwrap_or(false),
        cpu_manufacturer: info.processor_info().and_then(|p| p.manufacturer()).map(str::to_owned),
        cpu_clock_mhz: info
            .processor_info()
            .and_then(|p| p.sustained_clock_speed_in_ghz())
            .filter(|g| g.is_finite() && *g > 0.0)
            .map(|g| (g * 1000.0).round() as i64),
        local_nvme_gb: info
            .instance_storage_info()
            .filter(|s| s.nvme_support().is_some_and(|n| n.as_str() != "unsupported"))
            .and_then(|s| s.total_size_in_gb()),
        ebs_bandwidth_mbps: info
            .ebs_info()
            .and_then(|e| e.ebs_optimized_info())
            .and_then(|o| o.maximum_bandwidth_in_mbps())
            .map(i64::from),
        encryption_in_transit: info.network_info().and_then(|n| n.encryption_in_transit_supported()),
        accelerator: accelerator_of(info),
        efa_interfaces: i64::from(net.efa_info().and_then(|e| e.maximum_efa_interfaces()).unwrap_or(0).max(0)),
        network_bandwidth_mbps: {
            let gbps: f64 = net.network_cards().iter().filter_map(|c| c.baseline_bandwidth_in_gbps()).sum();
            (gbps.is_finite() && gbps > 0.0).then(|| (gbps * 1000.0).round() as i64)
        },
    }))
}

/// The accelerator devices of a type, as Karpenter reads them: Neuron devices (with their cores) when the
/// type has one kind, else one kind of (legacy) inference accelerator.
fn accelerator_of(info: &ec2::InstanceTypeInfo) -> Option<Accelerator> {
    if let Some(neuron) = info.neuron_info() {
        let [d] = neuron.neuron_devices() else { return None };
        let count = i64::from(d.count()?);
        return Some(Accelerator {
            name: d.name()?.to_owned(),
            manufacturer: "AWS".into(),
            count,
            cores: count * i64::from(d.core_info().and_then(|c| c.count()).unwrap_or(0)),
        });
    }
    let [a] = info.inference_accelerator_info()?.accelerators() else { return None };
    Some(Accelerator {
        name: a.name()?.to_owned(),
        manufacturer: a.manufacturer()?.to_owned(),
        count: i64::from(a.count()?),
        cores: 0,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::aws::catalog::{self, EFA, NEURON, NEURON_CORE};
    use crate::aws::kubelet::{AmiFamily, Kubelet};
    use tenon_core::resources::ResourceName;

    /// trn1.32xlarge as DescribeInstanceTypes describes it (moto's copy of EC2's answer): 16 Trainium
    /// devices of 2 cores, 8 EFA interfaces, 8 network cards of 100 Gbps.
    #[test]
    fn neuron_devices_efa_and_bandwidth_become_resources_and_labels() {
        let card = |i| {
            ec2::NetworkCardInfo::builder()
                .network_card_index(i)
                .maximum_network_interfaces(5)
                .baseline_bandwidth_in_gbps(100.0)
                .build()
        };
        let mut net = ec2::NetworkInfo::builder()
            .maximum_network_interfaces(40)
            .ipv4_addresses_per_interface(50)
            .efa_info(ec2::EfaInfo::builder().maximum_efa_interfaces(8).build());
        for i in 0..8 {
            net = net.network_cards(card(i));
        }
        let info = ec2::InstanceTypeInfo::builder()
            .instance_type(ec2::InstanceType::from("trn1.32xlarge"))
            .processor_info(ec2::ProcessorInfo::builder().supported_architectures(ec2::ArchitectureType::X8664).build())
            .v_cpu_info(ec2::VCpuInfo::builder().default_v_cpus(128).build())
            .memory_info(ec2::MemoryInfo::builder().size_in_mib(524_288).build())
            .network_info(net.build())
            .neuron_info(
                ec2::NeuronInfo::builder()
                    .neuron_devices(
                        ec2::NeuronDeviceInfo::builder()
                            .name("Trainium")
                            .count(16)
                            .core_info(ec2::NeuronDeviceCoreInfo::builder().count(2).version(2).build())
                            .build(),
                    )
                    .build(),
            )
            .build();
        let shape = shape_of(&info).unwrap().unwrap();
        let it = catalog::instance_type(&shape, 20, &Kubelet::default(), AmiFamily::Al2023, 0.075, Vec::new());
        let get = |name: &str| it.capacity.get(ResourceName::intern(name).unwrap());
        assert_eq!((get(NEURON), get(NEURON_CORE), get(EFA)), (16, 32, 8));
        assert_eq!(it.labels[catalog::LABEL_ACCELERATOR_NAME], "trainium");
        assert_eq!(it.labels[catalog::LABEL_ACCELERATOR_MANUFACTURER], "aws");
        assert_eq!(it.labels[catalog::LABEL_ACCELERATOR_COUNT], "16");
        assert_eq!(it.labels[catalog::LABEL_NETWORK_BANDWIDTH], "800000");
        assert!(!it.labels.contains_key(catalog::LABEL_GPU_COUNT));
        // trn1.32xlarge trunks 82 branch interfaces (the VPC resource controller's table); m5.large 9.
        assert_eq!(get(catalog::POD_ENI), 82);
        assert_eq!(catalog::branch_interfaces("m5.large"), Some(9));
        assert_eq!(catalog::branch_interfaces("t2.micro"), None, "no trunking on Xen types");
    }

    #[test]
    fn an_incomplete_instance_type_is_dropped_and_the_rest_remain() {
        let info = |name: &str, memory: Option<i64>| {
            let mut b = ec2::InstanceTypeInfo::builder()
                .instance_type(ec2::InstanceType::from(name))
                .processor_info(
                    ec2::ProcessorInfo::builder().supported_architectures(ec2::ArchitectureType::X8664).build(),
                )
                .v_cpu_info(ec2::VCpuInfo::builder().default_v_cpus(2).build())
                .network_info(
                    ec2::NetworkInfo::builder().maximum_network_interfaces(3).ipv4_addresses_per_interface(10).build(),
                );
            if let Some(m) = memory {
                b = b.memory_info(ec2::MemoryInfo::builder().size_in_mib(m).build());
            }
            b.build()
        };
        let shapes = shapes_of(&[info("m5.large", Some(8192)), info("x9.odd", None), info("c5.large", Some(4096))]);
        let mut names: Vec<&str> = shapes.keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["c5.large", "m5.large"]);
        assert!(shape_of(&info("x9.odd", None)).unwrap_err().to_string().contains("MemoryInfo.SizeInMiB"));
    }
}
