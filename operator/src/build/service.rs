//! Services: a cluster's headless Service (every tablet server by name, ready or not) and an
//! instance's client Service (the gRPC port of its ready tablet servers).

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{
    GRPC_PORT, HTTP_PORT, LABEL_COMPONENT, cluster_identity, cluster_selector,
    headless_service_name, instance_labels, instance_selector, instance_service_name, meta,
    owned_by,
};
use crate::crd::{Cluster, Instance};

fn ports() -> Vec<ServicePort> {
    vec![
        ServicePort {
            name: Some("grpc".into()),
            // Server-side apply needs the list key (port, protocol) complete: API servers
            // before 1.21 do not default it and refuse the patch.
            protocol: Some("TCP".into()),
            port: GRPC_PORT,
            target_port: Some(IntOrString::String("grpc".into())),
            app_protocol: Some("kubernetes.io/h2c".into()),
            ..ServicePort::default()
        },
        ServicePort {
            name: Some("http".into()),
            protocol: Some("TCP".into()),
            port: HTTP_PORT,
            target_port: Some(IntOrString::String("http".into())),
            ..ServicePort::default()
        },
    ]
}

/// A cluster's headless Service: the StatefulSet's `serviceName`, giving each tablet server a
/// stable DNS name.
pub fn headless_service(cluster: &Cluster) -> Service {
    let (name, namespace, labels) = cluster_identity(cluster);
    let mut svc_meta = meta(headless_service_name(&name), &namespace, labels);
    svc_meta.owner_references = Some(owned_by(cluster));
    Service {
        metadata: svc_meta,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            // Peers and the operator find every tablet server, ready or not.
            publish_not_ready_addresses: Some(true),
            selector: Some(cluster_selector(&name)),
            ports: Some(ports()),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// An instance's client Service: the endpoint its status reports, over every ready tablet
/// server of the instance.
pub fn instance_service(instance: &Instance) -> Service {
    let name = instance.metadata.name.clone().unwrap_or_default();
    let namespace = instance.metadata.namespace.clone().unwrap_or_default();
    let mut labels = instance_labels(&name);
    labels.insert(LABEL_COMPONENT.into(), "endpoint".into());
    let mut svc_meta = meta(instance_service_name(&name), &namespace, labels);
    svc_meta.owner_references = Some(owned_by(instance));
    Service {
        metadata: svc_meta,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(instance_selector(&name)),
            ports: Some(vec![ports().remove(0)]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}
