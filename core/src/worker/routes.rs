//! What a worker's request goes through first: the admission checks made
//! before any of its body is read, and the route of `PutBuffer` around the
//! generated server.

use std::net::SocketAddr;
use std::sync::Arc;

use tonic::codegen::http;

use super::service::Service;
use super::sessions::{session_id, unknown_session};
use super::{lock, Shared};
use crate::error::{Error, Result};
use crate::transport::bulk::{GET_BUFFER_PATH, PUT_BUFFER_PATH};
use crate::transport::proto::worker_server::WorkerServer;
use crate::transport::to_status;

/// The path of the one RPC that needs no session.
const OPEN_SESSION_PATH: &str = "/colocated.remote.v1.Worker/OpenSession";
/// The path of the RPC that may name a session that is gone (closing one
/// twice, or racing the worker's shutdown, is not a stranger's request).
const CLOSE_SESSION_PATH: &str = "/colocated.remote.v1.Worker/CloseSession";
/// The path of the RPC about the worker itself, which needs no session.
const HEALTH_PATH: &str = "/colocated.remote.v1.Worker/Health";

impl Service {
    /// The checks of every request, made by the router before any of its body
    /// is read: the token, then (for every RPC but `OpenSession`) a session
    /// that is open; or, for a `GetBuffer` of another worker, a read grant
    /// that is known and alive (see `copies`). A request that passes
    /// authenticates its connection (see
    /// [`admission`](crate::transport::admission)).
    fn admit<B>(&self, request: &http::Request<B>) -> Result<()> {
        let extensions = request.extensions();
        let peer = extensions
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(|i| i.remote_addr())
            .or_else(|| {
                extensions
                    .get::<tonic::transport::server::TlsConnectInfo<
                        tonic::transport::server::TcpConnectInfo,
                    >>()
                    .and_then(|i| i.get_ref().remote_addr())
            });
        let headers = request.headers();
        let path = request.uri().path();
        if path == GET_BUFFER_PATH {
            // Another worker's read, with a grant instead of the token.
            if let Some(granted) = self.0.grants.admits(headers) {
                granted.map_err(|e| self.refused(peer, e))?;
                return self.0.admission.authenticated(peer);
            }
        }
        self.authenticate(headers, peer)?;
        self.0.admission.authenticated(peer)?;
        if path != OPEN_SESSION_PATH && path != HEALTH_PATH {
            let id = session_id(headers).map_err(|e| self.refused(peer, e))?;
            if path != CLOSE_SESSION_PATH && !lock(&self.0.sessions).contains_key(&id) {
                return Err(self.refused(peer, unknown_session()));
            }
        }
        Ok(())
    }

    /// `err`, a refusal of a request from `peer`, logged (rate-limited).
    fn refused(&self, peer: Option<SocketAddr>, err: Error) -> Error {
        self.0.refusals.refused(peer, err.message());
        err
    }
}

/// The worker's gRPC service: `PutBuffer` goes to [`Service::put_http`] and
/// `GetBuffer` to [`Service::get_http`] (copy-free, see
/// [`bulk`](crate::transport::bulk)), every other RPC to the generated server.
#[derive(Clone)]
pub(crate) struct Routes {
    pub(super) grpc: WorkerServer<Service>,
    pub(super) shared: Arc<Shared>,
}

impl tonic::server::NamedService for Routes {
    const NAME: &'static str = <WorkerServer<Service> as tonic::server::NamedService>::NAME;
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for Routes {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::result::Result<(), Self::Error>> {
        tonic::codegen::Service::<http::Request<tonic::body::Body>>::poll_ready(&mut self.grpc, cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        // Refused before any of the body is read (or buffered by a decoder):
        // a stranger's request holds nothing but its headers.
        if let Err(e) = Service(self.shared.clone()).admit(&request) {
            return Box::pin(async move { Ok(to_status(&e).into_http()) });
        }
        let path = request.uri().path();
        if path == PUT_BUFFER_PATH {
            let service = Service(self.shared.clone());
            Box::pin(async move { Ok(service.put_http(request).await) })
        } else if path == GET_BUFFER_PATH {
            let service = Service(self.shared.clone());
            Box::pin(async move { Ok(service.get_http(request).await) })
        } else {
            self.grpc.call(request)
        }
    }
}
