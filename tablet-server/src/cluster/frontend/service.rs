//! The frontend as the `google.bigtable.v2.Bigtable` service of a cluster server: each call
//! goes to the read path ([`super::reads`]) or the write path ([`super::writes`]).

use std::sync::Arc;

use googleapis_tonic_google_bigtable_v2::google::bigtable::v2 as pb;
use tonic::{Request, Response, Status};

use basalt_model::schema::parse_instance_name;

use super::reads::{BoxedReadStream, SampleStream};
use super::state::Frontend;
use super::writes::MutateRowsStream;
use crate::proto::bigtable_server::Bigtable;

#[tonic::async_trait]
impl Bigtable for Arc<Frontend> {
    type ReadRowsStream = BoxedReadStream;
    type SampleRowKeysStream = SampleStream;
    type MutateRowsStream = MutateRowsStream;

    async fn read_rows(
        &self,
        request: Request<pb::ReadRowsRequest>,
    ) -> Result<Response<BoxedReadStream>, Status> {
        Frontend::read_rows(self, request).await
    }

    async fn sample_row_keys(
        &self,
        request: Request<pb::SampleRowKeysRequest>,
    ) -> Result<Response<SampleStream>, Status> {
        Frontend::sample_row_keys(self, request).await
    }

    async fn mutate_row(
        &self,
        request: Request<pb::MutateRowRequest>,
    ) -> Result<Response<pb::MutateRowResponse>, Status> {
        Frontend::mutate_row(self, request).await
    }

    async fn mutate_rows(
        &self,
        request: Request<pb::MutateRowsRequest>,
    ) -> Result<Response<MutateRowsStream>, Status> {
        Frontend::mutate_rows(self, request).await
    }

    async fn check_and_mutate_row(
        &self,
        request: Request<pb::CheckAndMutateRowRequest>,
    ) -> Result<Response<pb::CheckAndMutateRowResponse>, Status> {
        Frontend::check_and_mutate_row(self, request).await
    }

    async fn ping_and_warm(
        &self,
        request: Request<pb::PingAndWarmRequest>,
    ) -> Result<Response<pb::PingAndWarmResponse>, Status> {
        let name = &request.get_ref().name;
        if let Ok((p, i)) = parse_instance_name(name)
            && format!("projects/{p}/instances/{i}") != self.node.config.instance_name()
        {
            return Err(Status::not_found(format!("instance {name} not found")));
        }
        self.local.ping_and_warm(request).await
    }

    async fn read_modify_write_row(
        &self,
        request: Request<pb::ReadModifyWriteRowRequest>,
    ) -> Result<Response<pb::ReadModifyWriteRowResponse>, Status> {
        Frontend::read_modify_write_row(self, request).await
    }
}
