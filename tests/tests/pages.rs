//! The pages a visitor gets besides the site and the queue, and the queue
//! page's language, through a real node in front of a real (or a dead) HTTP
//! origin:
//! - a `reject` room answers every new visitor with the operator's reject
//!   template, or its JSON under the room's envelope (`cfWaitingRoom`);
//! - an origin that is down answers with the operator's error template
//!   (HTML and JSON), status 502 kept, never a 500, and the page does not
//!   claim the waiting room let anyone in where it did not;
//! - `Accept-Language` picks the queue page by language (`de-CH` → `de`),
//!   anything else (unknown, `q=0`, garbage, 10 KB of it, bytes that are
//!   not UTF-8) gets the default page, never a 400 or a 500;
//! - a template file that does not parse, or is missing, stops the node at
//!   start naming the key and the file.
use std::{
    net::{SocketAddr, TcpListener},
    path::Path,
};

use waitroom_tests::{
    edge::{SITE, client},
    inproc::InProcNode,
    procs::TempDir,
};

/// One answer: status, `Vary`, `Content-Type`, body.
struct Answer {
    status: u16,
    vary: String,
    content_type: String,
    body: String,
}

fn ask(node: &InProcNode, headers: &[(&str, &[u8])]) -> Answer {
    let mut req = http::Request::builder().uri(node.url("/"));
    for (name, value) in headers {
        req = req.header(*name, http::HeaderValue::from_bytes(value).unwrap());
    }
    let mut resp = client()
        .run(req.body(()).unwrap())
        .expect("the node answers");
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (vary, content_type) = (header("vary"), header("content-type"));
    Answer {
        status: resp.status().as_u16(),
        vary,
        content_type,
        body: resp.body_mut().read_to_string().unwrap_or_default(),
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// An address nothing listens on.
fn dead_address() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

#[test]
fn a_reject_room_answers_with_its_template_and_its_json() {
    let dir = TempDir::new("pages-reject");
    let page = write(
        dir.path(),
        "reject.mustache",
        "<h1>Sold out</h1><p>{{room}}: {{reason}} ({{status}}, {{queueingMethod}}, {{language}})</p>",
    );
    let node = InProcNode::start(
        "pages-reject",
        &format!(
            "total_active_users = 10\nnew_users_per_minute = 3\nqueueing_method = \"reject\"\n\
             json_envelope = \"cfWaitingRoom\"\ndefault_template_language = \"fr\"\n\
             reject_page = \"{page}\"\n"
        ),
    )
    .unwrap();
    // A reject room admits nobody new (it keeps sessions it has): every
    // new visitor gets the page, however many come.
    let answers: Vec<Answer> = (0..5).map(|_| ask(&node, &[])).collect();
    assert!(
        answers
            .iter()
            .all(|a| a.status == 403 && !a.body.contains(SITE))
    );
    let html = &answers[0];
    assert_eq!(html.status, 403);
    assert!(
        html.body
            .contains("<h1>Sold out</h1><p>shop: rejected (403, reject, fr)</p>"),
        "{}",
        html.body
    );
    assert!(!html.body.contains(SITE));
    assert!(html.vary.contains("Accept"), "{}", html.vary);
    let json = ask(&node, &[("accept", b"application/json")]);
    assert_eq!(json.status, 403);
    assert_eq!(json.content_type, "application/json");
    let v: serde_json::Value = serde_json::from_str(&json.body).unwrap();
    let room = &v["cfWaitingRoom"];
    assert_eq!(room["queueingMethod"], "reject", "{v}");
    assert_eq!(room["reason"], "rejected", "{v}");
    assert_eq!(room["inWaitingRoom"], false, "{v}");
}

#[test]
fn a_dead_origin_answers_with_the_error_template_and_json_never_a_500() {
    let dir = TempDir::new("pages-error");
    let page = write(
        dir.path(),
        "error.mustache",
        "<h1>Back soon</h1>{{#isOriginUnreachable}}<p id=unreachable>{{status}}</p>{{/isOriginUnreachable}}",
    );
    let node = InProcNode::start_in_front_of(
        "pages-error",
        dead_address(),
        &format!("total_active_users = 10\nnew_users_per_minute = 10\nerror_page = \"{page}\"\n"),
    )
    .unwrap();
    let html = ask(&node, &[]);
    assert_eq!(html.status, 502, "{}", html.body);
    assert_eq!(html.body, "<h1>Back soon</h1><p id=unreachable>502</p>");
    let json = ask(&node, &[("accept", b"application/json")]);
    assert_eq!(json.status, 502);
    let v: serde_json::Value = serde_json::from_str(&json.body).unwrap();
    assert_eq!(v["waitingRoom"]["reason"], "origin_unreachable", "{v}");
    assert_eq!(v["waitingRoom"]["status"], 502, "{v}");

    // Without a template of its own: the built-in page, which says what
    // failed and does not claim the waiting room let anyone in.
    let node = InProcNode::start_in_front_of(
        "pages-error-builtin",
        dead_address(),
        "total_active_users = 10\nnew_users_per_minute = 10\n",
    )
    .unwrap();
    let html = ask(&node, &[]);
    assert_eq!(html.status, 502);
    assert!(html.body.contains("could not be reached"), "{}", html.body);
    assert!(!html.body.contains("let you in"), "{}", html.body);
}

#[test]
fn accept_language_picks_the_queue_page_and_garbage_gets_the_default() {
    let dir = TempDir::new("pages-lang");
    let de = write(
        dir.path(),
        "queue.de.mustache",
        "<p lang={{language}}>Sie sind in der Warteschlange</p>",
    );
    let pt = write(
        dir.path(),
        "queue.pt-br.mustache",
        "<p lang={{language}}>Você está na fila</p>",
    );
    let node = InProcNode::start(
        "pages-lang",
        &format!(
            "total_active_users = 10\nnew_users_per_minute = 10\nqueue_all = true\n\
             default_template_language = \"en\"\n\
             queue_page_languages = {{ de = \"{de}\", pt-BR = \"{pt}\" }}\n"
        ),
    )
    .unwrap();
    let german = "Sie sind in der Warteschlange";
    let english = "You are in line";
    let huge = "xx;q=0.1,".repeat(1_200);
    let cases: [(&[u8], &str); 10] = [
        (b"de-CH,de;q=0.9,en;q=0.8", german),
        (b"en;q=0.9, DE", german),
        (b"pt", "Você está na fila"),
        (b"fr;q=0, de;q=0, *", english),
        (b"fr", english),
        (b";;;,q=abc", english),
        (b"*;q=0", english),
        (b"d\xc3\xa9, \xff\xfe", english),
        (b"de;q=2", english),
        (huge.as_bytes(), english),
    ];
    for (value, want) in cases {
        let a = ask(&node, &[("accept-language", value)]);
        assert_eq!(a.status, 200, "{:?}", String::from_utf8_lossy(value));
        assert!(
            a.body.contains(want),
            "{:?} → {}",
            String::from_utf8_lossy(value),
            &a.body[..a.body.len().min(300)]
        );
        assert_eq!(a.vary, "Accept, Accept-Language");
    }
    let a = ask(&node, &[("accept-language", b"de")]);
    assert!(a.body.contains("<p lang=de>"), "{}", a.body);
    let a = ask(&node, &[]);
    assert!(
        a.body.contains(english),
        "no Accept-Language: the default page"
    );
    assert_eq!(a.vary, "Accept, Accept-Language");
}

#[test]
fn a_template_that_does_not_load_stops_the_node_naming_key_and_file() {
    let dir = TempDir::new("pages-broken");
    let broken = write(
        dir.path(),
        "broken.mustache",
        "{{#open}} never closed {{/other}}",
    );
    let missing = dir.path().join("missing.mustache").display().to_string();
    for (room, key, file) in [
        (
            format!("error_page = \"{broken}\"\n"),
            "error_page",
            broken.as_str(),
        ),
        (
            format!("reject_page = \"{missing}\"\n"),
            "reject_page",
            missing.as_str(),
        ),
        (
            format!("queue_page_languages = {{ de = \"{broken}\" }}\n"),
            "queue_page_languages.de",
            broken.as_str(),
        ),
    ] {
        let err = InProcNode::start(
            "pages-broken",
            &format!("total_active_users = 10\nnew_users_per_minute = 10\n{room}"),
        )
        .err()
        .unwrap_or_else(|| panic!("refused"));
        let text = format!("{err:#}");
        assert!(text.contains(key) && text.contains(file), "{key}: {text}");
    }
    for (room, key) in [
        (
            "default_template_language = \"en_US\"\n",
            "default_template_language",
        ),
        (
            "queue_page_languages = { \"d e\" = \"/x\" }\n",
            "queue_page_languages",
        ),
    ] {
        let err = InProcNode::start(
            "pages-bad-tag",
            &format!("total_active_users = 10\nnew_users_per_minute = 10\n{room}"),
        )
        .err()
        .unwrap_or_else(|| panic!("refused"));
        assert!(format!("{err:#}").contains(key), "{key}: {err:#}");
    }
}
