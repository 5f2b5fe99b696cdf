//! Launch templates: one per (class, AMI, user data), named after a hash of what they hold, tagged to
//! the cluster and class; and the user data that joins their instances to the cluster
//! ([`super::bootstrap`]), from the cluster's facts (settings, else EKS `DescribeCluster`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types as ec2;
use k8s_openapi::api::core::v1::Taint;
use tenon_core::api::{NodeClaim, labels};
use tenon_core::cloud::{CapacityType, CloudError};

use super::bootstrap::{self, ClusterInfo};
use super::errors::sdk_error;
use super::kubelet::AmiFamily;
use super::nodeclass::{EC2NodeClass, EC2NodeClassStatus, ResolvedAmi};
use super::provider::{AwsProvider, TAG_EKS_CLUSTER, TAG_NODE_CLASS, TAG_NODE_POOL, filter, tag};
use super::reservations::ResolvedCapacityReservation;

impl AwsProvider {
    /// What nodes need of the cluster: the settings' endpoint, CA bundle and service CIDR, with what they
    /// leave out read once from EKS `DescribeCluster`. An error says what is missing and how to give it.
    pub(super) async fn cluster_info(&self) -> Result<Arc<ClusterInfo>, CloudError> {
        if let Some(c) = self.state().cluster.clone() {
            return Ok(c);
        }
        let s = &self.settings;
        let mut info = ClusterInfo {
            name: s.cluster_name.clone(),
            endpoint: s.cluster_endpoint.clone().unwrap_or_default(),
            ca_bundle: s.cluster_ca_bundle.clone(),
            service_cidr: s.cluster_service_cidr.clone(),
        };
        if info.endpoint.is_empty() || info.ca_bundle.is_none() || info.service_cidr.is_none() {
            let described = self.eks.describe_cluster().name(&s.cluster_name).send().await.map_err(|e| {
                let e = aws_sdk_eks::error::DisplayErrorContext(e);
                CloudError::NodeClassNotReady(format!(
                    "the cluster's endpoint, CA bundle or service CIDR is not set (CLUSTER_ENDPOINT, \
                     CLUSTER_CA_BUNDLE, CLUSTER_SERVICE_CIDR) and EKS DescribeCluster {} failed: {e}",
                    s.cluster_name
                ))
            })?;
            let cluster = described.cluster();
            if info.endpoint.is_empty() {
                info.endpoint = cluster.and_then(|c| c.endpoint()).unwrap_or_default().to_owned();
            }
            if info.ca_bundle.is_none() {
                info.ca_bundle =
                    cluster.and_then(|c| c.certificate_authority()).and_then(|a| a.data()).map(str::to_owned);
            }
            if info.service_cidr.is_none() {
                let network = cluster.and_then(|c| c.kubernetes_network_config());
                info.service_cidr =
                    network.and_then(|n| n.service_ipv4_cidr().or(n.service_ipv6_cidr())).map(str::to_owned);
            }
            if info.endpoint.is_empty() {
                return Err(CloudError::NodeClassNotReady(format!(
                    "EKS DescribeCluster {} reports no endpoint: set CLUSTER_ENDPOINT",
                    s.cluster_name
                )));
            }
        }
        let info = Arc::new(info);
        self.state().cluster = Some(info.clone());
        Ok(info)
    }

    /// The user data of `claim`'s node: the class's family's bootstrap, registering the node with the
    /// claim's labels (and its capacity type) and its taints, startup taints and
    /// `karpenter.sh/unregistered:NoExecute`.
    pub(super) async fn user_data(
        &self,
        class: &EC2NodeClass,
        claim: &NodeClaim,
        capacity_type: CapacityType,
    ) -> Result<String, CloudError> {
        let not_ready = |m: String| CloudError::NodeClassNotReady(format!("EC2NodeClass/{}: {m}", class.name()));
        let family = class.spec.family().map_err(not_ready)?;
        if family == AmiFamily::Custom {
            return Ok(class.spec.user_data.clone().unwrap_or_default());
        }
        let kubelet = class.spec.kubelet().map_err(not_ready)?;
        let raid0 = class.spec.raid0().map_err(not_ready)?;
        let cluster = self.cluster_info().await?;
        let mut node_labels: BTreeMap<String, String> = claim.metadata.labels.clone().unwrap_or_default();
        for r in &claim.spec.requirements {
            let single = r.operator == tenon_core::api::Operator::In && r.values.len() == 1;
            if single && !labels::is_well_known(&r.key) && !labels::RESTRICTED_LABELS.contains(&r.key.as_str()) {
                node_labels.entry(r.key.clone()).or_insert_with(|| r.values[0].clone());
            }
        }
        node_labels.insert(labels::CAPACITY_TYPE.to_owned(), capacity_type.as_str().to_owned());
        let mut taints: Vec<Taint> = claim.spec.taints.iter().chain(&claim.spec.startup_taints).cloned().collect();
        if !taints.iter().any(|t| t.key == labels::UNREGISTERED_TAINT) {
            taints.push(Taint {
                key: labels::UNREGISTERED_TAINT.to_owned(),
                value: None,
                effect: "NoExecute".to_owned(),
                time_added: None,
            });
        }
        let options = bootstrap::Options {
            cluster: &cluster,
            kubelet: &kubelet,
            labels: &node_labels,
            taints: &taints,
            custom: class.spec.user_data.as_deref(),
            raid0,
        };
        bootstrap::user_data(family, &options).map_err(not_ready)
    }

    /// Deletes the launch templates this cluster made for node class `class`, except those whose name
    /// starts with one of `keep` ([`AwsProvider::launch_template_prefix`]).
    pub(super) async fn delete_launch_templates(&self, class: &str, keep: &BTreeSet<String>) -> Result<(), CloudError> {
        let mut pages = self
            .ec2
            .describe_launch_templates()
            .filters(filter(&format!("tag:{}", self.cluster_tag()), ["owned"]))
            .filters(filter(&format!("tag:{TAG_NODE_CLASS}"), [class]))
            .into_paginator()
            .send();
        let mut stale = Vec::new();
        while let Some(page) = pages.next().await {
            let resp = page.map_err(|e| sdk_error("DescribeLaunchTemplates", e))?;
            stale.extend(
                resp.launch_templates()
                    .iter()
                    .filter_map(|t| t.launch_template_name())
                    .filter(|n| !keep.iter().any(|k| n.starts_with(k.as_str())))
                    .map(str::to_owned),
            );
        }
        for name in &stale {
            self.state().templates.remove(name);
            match self.ec2.delete_launch_template().launch_template_name(name).send().await {
                Ok(_) => {
                    tracing::info!(launch_template = %name, node_class = class, "deleted an unused launch template")
                }
                Err(e) if e.code().is_some_and(|c| c.starts_with("InvalidLaunchTemplateName.NotFound")) => {}
                Err(e) => return Err(sdk_error(&format!("DeleteLaunchTemplate {name}"), e)),
            }
        }
        Ok(())
    }

    /// The start of the names of the launch templates for (NodeClass spec, AMI, security groups, instance
    /// profile): each user data those boot with has its own template under it.
    pub(super) fn launch_template_prefix(
        &self,
        class: &EC2NodeClass,
        status: &EC2NodeClassStatus,
        ami: &ResolvedAmi,
    ) -> String {
        let sgs: Vec<&str> = status.security_groups.iter().map(|g| g.id.as_str()).collect();
        let key = serde_json::json!({
            "cluster": self.settings.cluster_name, "class": class.name(), "hash": class.static_hash(),
            "ami": ami.id, "sgs": sgs, "profile": status.instance_profile,
        });
        format!("tenon/{}/{}/", self.settings.cluster_name, tenon_core::api::stable_hash(&key))
    }

    /// The name of the launch template for (NodeClass spec, AMI, security groups, instance profile, user
    /// data, capacity type, reservation).
    fn launch_template_name(&self, class: &EC2NodeClass, status: &EC2NodeClassStatus, t: &Template<'_>) -> String {
        let mut key = serde_json::json!({"userData": t.user_data});
        // Keys added later join only when they say something, so existing templates keep their names.
        if self.settings.reserved_capacity {
            key["capacityType"] = t.capacity_type.as_str().into();
        }
        if let Some(r) = t.reservation {
            key["reservation"] = r.id.clone().into();
        }
        let data = match (self.settings.reserved_capacity, t.reservation) {
            (false, None) => tenon_core::api::stable_hash(&serde_json::Value::String(t.user_data.to_owned())),
            _ => tenon_core::api::stable_hash(&key),
        };
        format!("{}{data}", self.launch_template_prefix(class, status, t.ami))
    }

    /// The launch template for (NodeClass, AMI, user data, security groups, reservation), created when
    /// missing, tagged as tag-scoped IAM policies expect: the cluster, `eks:eks-cluster-name`, the class
    /// and the pool (whose claims' user data it carries); the network interfaces (and spot requests) it
    /// makes carry the same tags.
    pub(super) async fn ensure_launch_template(
        &self,
        class: &EC2NodeClass,
        status: &EC2NodeClassStatus,
        template: &Template<'_>,
    ) -> Result<String, CloudError> {
        let (ami, pool) = (template.ami, template.pool);
        let name = self.launch_template_name(class, status, template);
        if self.state().templates.contains(&name) {
            return Ok(name);
        }
        let found = self.ec2.describe_launch_templates().launch_template_names(&name).send().await;
        let exists = match found {
            Ok(r) => !r.launch_templates().is_empty(),
            Err(e) if e.code().is_some_and(|c| c.starts_with("InvalidLaunchTemplateName.NotFound")) => false,
            Err(e) => return Err(sdk_error("DescribeLaunchTemplates", e)),
        };
        if !exists {
            let mut owned: BTreeMap<String, String> = class.spec.tags.clone();
            owned.insert(self.cluster_tag(), "owned".into());
            owned.insert(TAG_NODE_CLASS.into(), class.name().into());
            owned.insert(TAG_EKS_CLUSTER.into(), self.settings.cluster_name.clone());
            owned.insert(TAG_NODE_POOL.into(), pool.into());
            let mut data = self.launch_template_data(class, status, ami, template.user_data)?;
            let mut made = vec![ec2::ResourceType::NetworkInterface];
            if template.capacity_type == CapacityType::Spot {
                made.push(ec2::ResourceType::SpotInstancesRequest);
            }
            for rt in made {
                data = data.tag_specifications(
                    ec2::LaunchTemplateTagSpecificationRequest::builder()
                        .resource_type(rt)
                        .set_tags(Some(owned.iter().map(|(k, v)| tag(k, v)).collect()))
                        .build(),
                );
            }
            if self.settings.reserved_capacity {
                data = data.capacity_reservation_specification(reservation_specification(template.reservation));
            }
            if let Some(market) = template.reservation.and_then(reservation_market) {
                data = data.instance_market_options(
                    ec2::LaunchTemplateInstanceMarketOptionsRequest::builder().market_type(market).build(),
                );
            }
            let data = data.build();
            let tags = ec2::TagSpecification::builder()
                .resource_type(ec2::ResourceType::LaunchTemplate)
                .set_tags(Some(owned.iter().map(|(k, v)| tag(k, v)).collect()));
            match self
                .ec2
                .create_launch_template()
                .launch_template_name(&name)
                .launch_template_data(data)
                .tag_specifications(tags.build())
                .send()
                .await
            {
                Ok(_) => {}
                Err(e) if e.code().is_some_and(|c| c.contains("AlreadyExists")) => {}
                Err(e) => return Err(sdk_error(&format!("CreateLaunchTemplate {name}"), e)),
            }
        }
        self.state().templates.insert(name.clone());
        Ok(name)
    }

    fn launch_template_data(
        &self,
        class: &EC2NodeClass,
        status: &EC2NodeClassStatus,
        ami: &ResolvedAmi,
        user_data: &str,
    ) -> Result<ec2::builders::RequestLaunchTemplateDataBuilder, CloudError> {
        let s = &class.spec;
        let mut d = ec2::RequestLaunchTemplateData::builder().image_id(&ami.id);
        for g in &status.security_groups {
            d = d.security_group_ids(&g.id);
        }
        if !user_data.is_empty() {
            d = d.user_data(aws_smithy_types::base64::encode(user_data.as_bytes()));
        }
        if let Some(p) = &status.instance_profile {
            d = d.iam_instance_profile(
                ec2::LaunchTemplateIamInstanceProfileSpecificationRequest::builder().name(p).build(),
            );
        }
        let root_gib = self.root_volume_gib(Some(class));
        for b in &s.block_devices(root_gib) {
            let mut m = ec2::LaunchTemplateBlockDeviceMappingRequest::builder().device_name(&b.device_name);
            if let Some(e) = &b.ebs {
                let size = e
                    .size_gib()
                    .map_err(|m| CloudError::NodeClassNotReady(format!("EC2NodeClass/{}: {m}", class.name())))?;
                let ebs = ec2::LaunchTemplateEbsBlockDeviceRequest::builder()
                    .set_volume_size(size)
                    .set_volume_type(e.volume_type.as_deref().map(ec2::VolumeType::from))
                    .set_iops(e.iops)
                    .set_throughput(e.throughput)
                    .set_encrypted(e.encrypted)
                    .set_kms_key_id(e.kms_key_id.clone())
                    .set_snapshot_id(e.snapshot_id.clone())
                    .delete_on_termination(e.delete_on_termination.unwrap_or(true))
                    .build();
                m = m.ebs(ebs);
            }
            d = d.block_device_mappings(m.build());
        }
        let md = s.metadata_options.clone().unwrap_or_default();
        d = d.metadata_options(
            ec2::LaunchTemplateInstanceMetadataOptionsRequest::builder()
                .http_endpoint(ec2::LaunchTemplateInstanceMetadataEndpointState::from(
                    md.http_endpoint.as_deref().unwrap_or("enabled"),
                ))
                .http_protocol_ipv6(ec2::LaunchTemplateInstanceMetadataProtocolIpv6::from(
                    md.http_protocol_ipv6.as_deref().unwrap_or("disabled"),
                ))
                .http_put_response_hop_limit(md.http_put_response_hop_limit.unwrap_or(1))
                .http_tokens(ec2::LaunchTemplateHttpTokensState::from(md.http_tokens.as_deref().unwrap_or("required")))
                // Instance tags stay out of the metadata service, as Karpenter launches them.
                .instance_metadata_tags(ec2::LaunchTemplateInstanceMetadataTagsState::Disabled)
                .build(),
        );
        if let Some(on) = s.detailed_monitoring {
            d = d.monitoring(ec2::LaunchTemplatesMonitoringRequest::builder().enabled(on).build());
        }
        if let Some(public) = s.associate_public_ip_address {
            // The interface then carries the security groups the template would otherwise.
            let groups: Vec<String> = status.security_groups.iter().map(|g| g.id.clone()).collect();
            d = d.set_security_group_ids(None).network_interfaces(
                ec2::LaunchTemplateInstanceNetworkInterfaceSpecificationRequest::builder()
                    .device_index(0)
                    .associate_public_ip_address(public)
                    .set_groups(Some(groups))
                    .build(),
            );
        }
        Ok(d)
    }
}

/// What a launch template is made for, beyond its class.
#[derive(Debug, Clone, Copy)]
pub(super) struct Template<'a> {
    /// The image.
    pub(super) ami: &'a ResolvedAmi,
    /// The user data.
    pub(super) user_data: &'a str,
    /// The pool whose claims it launches (a tag).
    pub(super) pool: &'a str,
    /// The capacity type of its launches.
    pub(super) capacity_type: CapacityType,
    /// The reservation its launches draw on.
    pub(super) reservation: Option<&'a ResolvedCapacityReservation>,
}

/// The template's reservation preference: only the reservation a reserved launch chose; none for every
/// other launch, which so never lands in an open reservation by chance.
fn reservation_specification(
    reservation: Option<&ResolvedCapacityReservation>,
) -> ec2::LaunchTemplateCapacityReservationSpecificationRequest {
    let b = ec2::LaunchTemplateCapacityReservationSpecificationRequest::builder();
    match reservation {
        Some(r) => b
            .capacity_reservation_preference(ec2::CapacityReservationPreference::CapacityReservationsOnly)
            .capacity_reservation_target(
                ec2::CapacityReservationTarget::builder().capacity_reservation_id(&r.id).build(),
            ),
        None => b.capacity_reservation_preference(ec2::CapacityReservationPreference::None),
    }
    .build()
}

/// The market a reservation's instances are bought in, when not on-demand's.
fn reservation_market(r: &ResolvedCapacityReservation) -> Option<ec2::MarketType> {
    if r.is_capacity_block() {
        Some(ec2::MarketType::CapacityBlock)
    } else if r.interruptible {
        Some(ec2::MarketType::InterruptibleCapacityReservation)
    } else {
        None
    }
}
