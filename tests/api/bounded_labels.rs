//! Nothing a client without a key sends grows the service's memory or its
//! metrics without bound (issue 56, finding 1): any token is an HTTP
//! method, so the `method` label of `token_billing_http_requests_total` and
//! the access log take one of the methods HTTP defines or `other`; routes
//! are labelled by their pattern and unmatched paths as `unmatched`.

use reqwest::Method;

use crate::helpers::TestApp;

/// The process's resident memory (the service runs in the test's process).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_junk_methods_and_paths_grow_nothing() {
    let app = TestApp::spawn().await;
    // Warm up: one request of each kind, so the label values that do exist
    // (`other`, `unmatched`) are in the exposition before it is measured.
    let junk = |n: usize| {
        Method::from_bytes(format!("JUNK{n:04}{}", "X".repeat(2_000)).as_bytes())
            .expect("a method token")
    };
    let send = |method: Method, path: String| {
        let client = app.client.clone();
        let url = app.url(&path);
        async move { client.request(method, url).send().await.map(|r| r.status()) }
    };
    let _ = send(junk(9_999), "/healthz".into()).await;
    let _ = send(Method::GET, "/no/such/path".into()).await;
    let before_text = app.metrics_text().await.len();
    let before_rss = rss_kib();

    for n in 0..1_000 {
        let (method, path) = if n % 2 == 0 {
            (junk(n), "/healthz".to_owned())
        } else {
            (Method::GET, format!("/junk/{n}/{}", "p".repeat(200)))
        };
        send(method, path).await.expect("answered");
    }

    let after_text = app.metrics_text().await;
    let grown = after_text.len().saturating_sub(before_text);
    assert!(
        grown < 10 * 1024,
        "/metrics grew by {grown} bytes over 1,000 junk requests"
    );
    assert!(
        !after_text.contains("JUNK"),
        "a client's method became a label value"
    );
    assert!(after_text.contains(r#"method="other""#), "{after_text}");
    // 1,000 junk requests of 2 KB methods: unbounded labels kept them all
    // (2 MB and more); bounded ones keep nothing. The bound leaves room
    // for the allocator's own movement in a process that runs the tests.
    let grown_rss = rss_kib().saturating_sub(before_rss);
    assert!(
        grown_rss < 16 * 1024,
        "resident memory grew by {grown_rss} KiB"
    );
}
