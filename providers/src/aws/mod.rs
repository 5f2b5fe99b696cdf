//! The AWS provider: EC2 through `aws-sdk-ec2`, interruption events through `aws-sdk-sqs`.
//!
//! - [`EC2NodeClass`] (`karpenter.k8s.aws/v1`) says how to launch; feed them with
//!   [`AwsProvider::apply_node_class`].
//! - Instance types come from `DescribeInstanceTypes` and `DescribeInstanceTypeOfferings`, priced from a
//!   bundled on-demand table and `DescribeSpotPriceHistory`, with the EKS overhead formulas.
//! - Launches are one `CreateFleet` (type `instant`) over the cheapest compatible types × zonal subnets.
//! - Instances are tagged `kubernetes.io/cluster/<name>=owned`; only those are listed, read or deleted.
//!
//! See `docs/aws.md` for the settings and the IAM permissions.

pub mod ami;
pub mod bootstrap;
pub mod catalog;
mod errors;
pub mod events;
mod fleet;
mod instance_profile;
mod instances;
mod interruption;
pub mod kubelet;
mod launch_template;
pub mod nodeclass;
mod offerings;
mod pricing;
mod provider;
pub mod reservations;
mod resolve;
mod settings;
mod shapes;

pub use instances::{instance_id, provider_id};
pub use nodeclass::{EC2NodeClass, EC2NodeClassSpec, EC2NodeClassStatus};
pub use provider::{AwsProvider, NAME, TAG_EKS_CLUSTER, TAG_NODE_CLAIM, TAG_NODE_CLASS, TAG_NODE_POOL};
pub use settings::AwsSettings;
pub use shapes::{shape_of, shapes_of};
