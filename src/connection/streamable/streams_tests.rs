use super::*;

fn update(sid: &str, seq: u64) -> Utf8Bytes {
    Utf8Bytes::from(crate::protocol::session_update_raw_id(
        &format!("\"{sid}\""),
        r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}"#,
        seq,
        None,
    ))
}

fn answer(id: u64, result: &str) -> Utf8Bytes {
    Utf8Bytes::from(format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#))
}

fn texts(take: Take) -> Vec<String> {
    match take {
        Take::Frames(events) => events.iter().map(|e| e.text.to_string()).collect(),
        other => panic!("expected frames, got {other:?}"),
    }
}

fn seqs(take: Take) -> Vec<Option<u64>> {
    match take {
        Take::Frames(events) => events.iter().map(|e| e.seq).collect(),
        other => panic!("expected frames, got {other:?}"),
    }
}

#[test]
fn a_session_without_its_own_stream_is_carried_on_the_connections() {
    let mut s = Streams::new(4);
    let conn = s.attach(None, None).expect("connection stream");
    assert!(s.deliver(update("a", 1)).is_none());
    assert_eq!(seqs(s.take(None, conn.reader, 1 << 20)), vec![Some(1)]);
    // Once the client opens the session's stream, its updates go there.
    let a = s.attach(Some("a"), None).expect("session stream");
    assert!(s.deliver(update("a", 2)).is_none());
    assert!(matches!(s.take(None, conn.reader, 1 << 20), Take::Empty));
    assert_eq!(seqs(s.take(Some("a"), a.reader, 1 << 20)), vec![Some(2)]);
}

#[test]
fn answers_go_where_their_request_was_posted_and_new_sessions_get_a_stream() {
    let mut s = Streams::new(4);
    let conn = s.attach(None, None).expect("connection stream");
    // session/new's answer goes on the connection's stream and makes the session's.
    s.deliver(answer(1, r#"{"sessionId":"b"}"#));
    assert_eq!(texts(s.take(None, conn.reader, 1 << 20)).len(), 1);
    // What follows is held for the session's stream, opened later.
    s.deliver(update("b", 1));
    s.route("2", "b");
    s.deliver(answer(2, r#"{"stopReason":"end_turn"}"#));
    assert!(matches!(s.take(None, conn.reader, 1 << 20), Take::Empty));
    let b = s.attach(Some("b"), None).expect("session stream");
    let got = texts(s.take(Some("b"), b.reader, 1 << 20));
    assert_eq!(got.len(), 2);
    assert!(got[1].contains("end_turn"), "the answer after the update it follows");
    // An answer to a request posted for a session with no stream goes on the connection's.
    s.route("3", "zzz");
    s.deliver(answer(3, "null"));
    assert_eq!(texts(s.take(None, conn.reader, 1 << 20)).len(), 1);
}

#[test]
fn an_answer_waited_for_in_person_goes_to_its_waiter() {
    let mut s = Streams::new(4);
    let (tx, mut rx) = oneshot::channel();
    s.wait_for("0", tx);
    let back = s.deliver(answer(0, r#"{"protocolVersion":1}"#)).expect("not queued");
    assert!(back.counted, "its room is given back");
    assert!(rx.try_recv().expect("answered").contains("protocolVersion"));
}

#[test]
fn a_reader_back_with_last_event_id_gets_what_the_lost_one_took_and_nothing_twice() {
    let mut s = Streams::new(4);
    let first = s.attach(Some("a"), None).expect("stream");
    for seq in 1..=3 {
        s.deliver(update("a", seq));
    }
    // The first reader took 1..=3, but its response broke after 1 reached the client.
    assert_eq!(seqs(s.take(Some("a"), first.reader, 1 << 20)).len(), 3);
    s.deliver(update("a", 4));
    let second = s.attach(Some("a"), Some((1, 0))).expect("again");
    assert_eq!(second.replay, Some((1, 3)), "2 and 3 are read from the store");
    // The old reader is told to stop.
    assert!(matches!(s.take(Some("a"), first.reader, 1 << 20), Take::Done));
    let stored = (2..=3)
        .map(|seq| Event {
            seq: Some(seq),
            text: update("a", seq),
            counted: false,
            at: None,
        })
        .collect();
    s.prepend(Some("a"), second.reader, merge(stored, second.again));
    assert_eq!(
        seqs(s.take(Some("a"), second.reader, 1 << 20)),
        vec![Some(2), Some(3), Some(4)]
    );
    // A reader that has more than was queued drops it, and nothing at or below it comes later.
    s.deliver(update("a", 5));
    let third = s.attach(Some("a"), Some((5, 0))).expect("again");
    assert_eq!(third.replay, None);
    assert_eq!(third.dropped.len(), 1);
    assert!(s.deliver(update("a", 5)).is_some(), "a replay of 5 is not sent again");
    assert!(matches!(s.take(Some("a"), third.reader, 1 << 20), Take::Empty));
}

#[test]
fn streams_are_bounded_and_end_with_the_connection() {
    let mut s = Streams::new(1);
    s.attach(Some("a"), None).expect("one");
    assert_eq!(s.attach(Some("b"), None).map(|_| ()), Err(TooManyStreams));
    assert!(!s.ensure("b"));
    // Frames with no reader come back at the end (their room given back); readers stop once
    // they have taken what is queued.
    let conn = s.attach(None, None).expect("connection");
    s.deliver(answer(9, "null"));
    s.detach(None, conn.reader);
    let a = s.attach(Some("a"), None).expect("again");
    s.deliver(update("a", 1));
    assert_eq!(s.end().len(), 1);
    assert_eq!(seqs(s.take(Some("a"), a.reader, 1 << 20)), vec![Some(1)]);
    assert!(matches!(s.take(Some("a"), a.reader, 1 << 20), Take::Done));
}

#[test]
fn a_take_is_bounded_in_bytes_but_never_empty() {
    let mut s = Streams::new(1);
    let conn = s.attach(None, None).expect("connection");
    for id in 0..3 {
        s.deliver(answer(id, &format!("\"{}\"", "x".repeat(100))));
    }
    assert_eq!(texts(s.take(None, conn.reader, 10)).len(), 1);
    assert_eq!(texts(s.take(None, conn.reader, 1 << 20)).len(), 2);
}

#[test]
fn an_answer_a_lost_reader_took_is_taken_again_in_its_place() {
    let mut s = Streams::new(4);
    let first = s.attach(Some("a"), None).expect("stream");
    s.route("7", "a");
    s.deliver(update("a", 1));
    s.deliver(update("a", 2));
    s.deliver(answer(7, r#"{"stopReason":"end_turn"}"#));
    let Take::Frames(taken) = s.take(Some("a"), first.reader, 1 << 20) else {
        panic!("frames")
    };
    // The answer is numbered after the update it follows.
    assert_eq!(taken[2].at, Some((2, 1)));
    assert_eq!(taken[0].at, None, "an update is numbered by its seq");
    // The client got update 1 only; update 2 and the answer are taken again, in order.
    let second = s.attach(Some("a"), Some((1, 0))).expect("again");
    assert_eq!(second.replay, Some((1, 2)));
    assert_eq!(second.again.len(), 1);
    let stored = vec![Event {
        seq: Some(2),
        text: update("a", 2),
        counted: false,
        at: None,
    }];
    s.prepend(Some("a"), second.reader, merge(stored, second.again));
    let Take::Frames(again) = s.take(Some("a"), second.reader, 1 << 20) else {
        panic!("frames")
    };
    assert_eq!(again.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![Some(2), None]);
    assert_eq!(again[1].at, Some((2, 1)), "numbered as before");
    // A client that had the answer gets nothing again.
    let third = s.attach(Some("a"), Some((2, 1))).expect("again");
    assert!(third.replay.is_none() && third.again.is_empty());
    assert!(matches!(s.take(Some("a"), third.reader, 1 << 20), Take::Empty));
}
