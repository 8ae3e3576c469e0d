//! An in-memory Kubernetes API server for controller tests, behind kube-rs's tower-test mock
//! service: it stores objects by path and answers GET (object and list with label selectors),
//! server-side apply (spec/metadata replaced, status only through `/status`), JSON merge patches
//! (with resourceVersion preconditions, for finalizers), DELETE (deferred while finalizers
//! remain) and event creation. Enough of the API's behaviour for reconciles to run unchanged;
//! a real API server is the next level of testing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

#[derive(Default)]
pub struct State {
    /// Object path (`/apis/g/v/namespaces/ns/plural/name` or `/api/v1/...`) → object.
    pub objects: BTreeMap<String, Value>,
    /// Events published, in order (reason, note).
    pub events: Vec<(String, String)>,
    /// Requests served: (method, path without query).
    pub requests: Vec<(String, String)>,
    next_version: u64,
}

#[derive(Clone, Default)]
pub struct FakeApi {
    pub state: Arc<Mutex<State>>,
}

fn status(code: StatusCode, reason: &str, message: String) -> Response<Body> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

fn ok(value: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(value).unwrap()))
        .unwrap()
}

/// RFC 7386 JSON merge patch.
fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn matches_selector(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (k, v) = term.split_once('=').unwrap_or((term, ""));
        obj["metadata"]["labels"][k].as_str() == Some(v)
    })
}

/// `labelSelector` from a query string, percent-decoded.
fn label_selector(query: &str) -> String {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("labelSelector="))
        .map(|s| {
            let mut out = Vec::new();
            let b = s.as_bytes();
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'%' && i + 2 < b.len() {
                    out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
                    i += 3;
                } else {
                    out.push(if b[i] == b'+' { b' ' } else { b[i] });
                    i += 1;
                }
            }
            String::from_utf8(out).unwrap()
        })
        .unwrap_or_default()
}

impl FakeApi {
    /// A client talking to this fake.
    pub fn client(&self) -> Client {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let api = self.clone();
        tokio::spawn(async move {
            while let Some((request, respond)) = handle.next_request().await {
                let response = api.serve(request).await;
                respond.send_response(response);
            }
        });
        Client::new(service, "default")
    }

    /// Stores an object as a user would create it (server fields filled in).
    pub fn create(&self, path: &str, mut obj: Value) {
        let mut s = self.state.lock().unwrap();
        s.next_version += 1;
        let v = s.next_version;
        let meta = obj["metadata"].as_object_mut().unwrap();
        meta.insert("resourceVersion".into(), json!(v.to_string()));
        meta.insert("uid".into(), json!(format!("uid-{v}")));
        meta.insert("generation".into(), json!(1));
        meta.insert("creationTimestamp".into(), json!("2026-11-21T00:00:00Z"));
        s.objects.insert(path.into(), obj);
    }

    pub fn get(&self, path: &str) -> Option<Value> {
        self.state.lock().unwrap().objects.get(path).cloned()
    }

    /// Changes an object's spec as `kubectl apply` would (the generation moves).
    pub fn update_spec(&self, path: &str, patch: Value) {
        let mut s = self.state.lock().unwrap();
        s.next_version += 1;
        let v = s.next_version;
        let obj = s.objects.get_mut(path).expect("object exists");
        merge_patch(&mut obj["spec"], &patch);
        obj["metadata"]["resourceVersion"] = json!(v.to_string());
        let g = obj["metadata"]["generation"].as_i64().unwrap_or(1);
        obj["metadata"]["generation"] = json!(g + 1);
    }

    /// Sets an object's status as another controller would (e.g. the StatefulSet controller).
    pub fn set_status(&self, path: &str, status: Value) {
        let mut s = self.state.lock().unwrap();
        let obj = s.objects.get_mut(path).expect("object exists");
        obj["status"] = status;
    }

    pub fn events(&self) -> Vec<(String, String)> {
        self.state.lock().unwrap().events.clone()
    }

    /// Deletes as `kubectl delete` does.
    pub fn delete(&self, path: &str) {
        let mut s = self.state.lock().unwrap();
        Self::delete_locked(&mut s, path);
    }

    fn delete_locked(s: &mut State, path: &str) {
        let Some(obj) = s.objects.get_mut(path) else {
            return;
        };
        let has_finalizers = obj["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            obj["metadata"]["deletionTimestamp"] = json!("2026-11-21T00:00:01Z");
        } else {
            s.objects.remove(path);
        }
    }

    async fn serve(&self, request: Request<Body>) -> Response<Body> {
        let method = request.method().clone();
        let path = request.uri().path().to_string();
        let query = request.uri().query().unwrap_or_default().to_string();
        let content_type = request
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = request.into_body().collect_bytes().await.unwrap();
        let mut s = self.state.lock().unwrap();
        s.requests.push((method.to_string(), path.clone()));

        if method == Method::POST && path.ends_with("/events") {
            let e: Value = serde_json::from_slice(&body).unwrap();
            s.events.push((
                e["reason"].as_str().unwrap_or_default().into(),
                e["note"].as_str().unwrap_or_default().into(),
            ));
            return ok(&e);
        }
        let (object_path, subresource) = match path.strip_suffix("/status") {
            Some(p) => (p.to_string(), Some("status")),
            None => (path.clone(), None),
        };
        match method {
            Method::GET => {
                if let Some(obj) = s.objects.get(&object_path) {
                    return ok(obj);
                }
                // A namespaced collection: `/api/v1/namespaces/NS/PLURAL` or
                // `/apis/GROUP/VERSION/namespaces/NS/PLURAL`.
                let segments = object_path.split('/').filter(|p| !p.is_empty()).count();
                let is_collection = (object_path.starts_with("/api/") && segments == 5)
                    || (object_path.starts_with("/apis/") && segments == 6);
                if is_collection {
                    let prefix = format!("{object_path}/");
                    let selector = label_selector(&query);
                    let items: Vec<Value> = s
                        .objects
                        .iter()
                        .filter(|(k, _)| k.starts_with(&prefix) && !k[prefix.len()..].contains('/'))
                        .map(|(_, v)| v.clone())
                        .filter(|v| matches_selector(v, &selector))
                        .collect();
                    return ok(&json!({
                        "apiVersion": "v1", "kind": "List",
                        "metadata": {"resourceVersion": s.next_version.to_string()},
                        "items": items,
                    }));
                }
                status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("{object_path} not found"),
                )
            }
            Method::PATCH => {
                let patch: Value = serde_json::from_slice(&body).unwrap();
                s.next_version += 1;
                let v = s.next_version;
                if content_type.starts_with("application/apply-patch") {
                    if let Some("status") = subresource {
                        let Some(obj) = s.objects.get_mut(&object_path) else {
                            return status(
                                StatusCode::NOT_FOUND,
                                "NotFound",
                                format!("{object_path} not found"),
                            );
                        };
                        obj["status"] = patch["status"].clone();
                        obj["metadata"]["resourceVersion"] = json!(v.to_string());
                        return ok(obj);
                    }
                    let existing = s.objects.get(&object_path).cloned();
                    let mut obj = patch.clone();
                    let meta = obj["metadata"].as_object_mut().unwrap();
                    meta.insert("resourceVersion".into(), json!(v.to_string()));
                    match existing {
                        Some(old) => {
                            meta.insert("uid".into(), old["metadata"]["uid"].clone());
                            let changed = old.get("spec") != patch.get("spec");
                            let g = old["metadata"]["generation"].as_i64().unwrap_or(1);
                            meta.insert(
                                "generation".into(),
                                json!(if changed { g + 1 } else { g }),
                            );
                            if let Some(st) = old.get("status") {
                                obj["status"] = st.clone();
                            }
                        }
                        None => {
                            meta.insert("uid".into(), json!(format!("uid-{v}")));
                            meta.insert("generation".into(), json!(1));
                        }
                    }
                    s.objects.insert(object_path, obj.clone());
                    ok(&obj)
                } else {
                    let Some(obj) = s.objects.get_mut(&object_path) else {
                        return status(
                            StatusCode::NOT_FOUND,
                            "NotFound",
                            format!("{object_path} not found"),
                        );
                    };
                    if let Some(rv) = patch["metadata"]["resourceVersion"].as_str()
                        && obj["metadata"]["resourceVersion"].as_str() != Some(rv)
                    {
                        return status(
                            StatusCode::CONFLICT,
                            "Conflict",
                            "the object has been modified".into(),
                        );
                    }
                    let mut patch = patch.clone();
                    if let Some(m) = patch["metadata"].as_object_mut() {
                        m.remove("resourceVersion");
                    }
                    merge_patch(obj, &patch);
                    obj["metadata"]["resourceVersion"] = json!(v.to_string());
                    let done = obj["metadata"]["deletionTimestamp"].is_string()
                        && obj["metadata"]["finalizers"]
                            .as_array()
                            .is_none_or(|f| f.is_empty());
                    let out = obj.clone();
                    if done {
                        s.objects.remove(&object_path);
                    }
                    ok(&out)
                }
            }
            Method::DELETE => {
                let Some(obj) = s.objects.get(&object_path).cloned() else {
                    return status(
                        StatusCode::NOT_FOUND,
                        "NotFound",
                        format!("{object_path} not found"),
                    );
                };
                Self::delete_locked(&mut s, &object_path);
                ok(&obj)
            }
            _ => status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!("{method} {path}"),
            ),
        }
    }
}
