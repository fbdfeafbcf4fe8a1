//! What a prompt may carry besides text: `image`, `audio` and embedded `resource` blocks only
//! where the session's agent says it takes them (`promptCapabilities`, ACP: a client must not
//! send others), and all of them together within `[limits] attachment_bytes`. Checked before the
//! prompt is recorded or sent, so a refused prompt leaves nothing behind; the error names the
//! block and the capability or setting. `resource_link` blocks are links, not content: always
//! allowed, as text is.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::protocol::RpcError;

/// One prompt block, as far as this check reads it.
#[derive(Deserialize)]
struct Block<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    /// `image` and `audio`: base64.
    #[serde(default, borrow)]
    data: Option<std::borrow::Cow<'a, str>>,
    /// `resource`: `{uri, text}` or `{uri, blob}` (base64).
    #[serde(default, borrow)]
    resource: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Resource<'a> {
    #[serde(default, borrow)]
    text: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    blob: Option<std::borrow::Cow<'a, str>>,
}

/// Bytes a base64 string decodes to (line breaks, which some encoders add, count as data: at
/// most two bytes too many per 76 characters).
fn decoded_len(base64: &str) -> usize {
    let trimmed = base64.trim_end_matches('=');
    trimmed.len() / 4 * 3 + (trimmed.len() % 4) * 3 / 4
}

/// Checks `prompt` (the `prompt` array) against the agent's `promptCapabilities` and the cap.
pub(super) fn check(
    prompt: &RawValue,
    capabilities: &serde_json::Map<String, serde_json::Value>,
    cap: usize,
) -> Result<(), RpcError> {
    let blocks: Vec<Block<'_>> = serde_json::from_str(prompt.get())
        .map_err(|e| RpcError::invalid_params(format!("prompt: not an array of content blocks: {e}")))?;
    let takes = |what: &str| {
        capabilities
            .get("promptCapabilities")
            .and_then(|c| c.get(what))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    };
    let mut total = 0usize;
    for (i, block) in blocks.iter().enumerate() {
        let (capability, bytes) = match &*block.kind {
            "image" | "audio" => (&*block.kind, block.data.as_deref().map_or(0, decoded_len)),
            "resource" => {
                let resource: Resource<'_> = block
                    .resource
                    .map(|r| serde_json::from_str(r.get()))
                    .transpose()
                    .map_err(|e| RpcError::invalid_params(format!("prompt[{i}]: resource: {e}")))?
                    .unwrap_or(Resource { text: None, blob: None });
                let bytes =
                    resource.text.as_deref().map_or(0, str::len) + resource.blob.as_deref().map_or(0, decoded_len);
                ("embeddedContext", bytes)
            }
            _ => continue,
        };
        if !takes(capability) {
            return Err(RpcError::invalid_params(format!(
                "prompt[{i}]: this agent does not take {} blocks (promptCapabilities.{capability} is not true)",
                block.kind
            )));
        }
        total += bytes;
    }
    if total > cap {
        return Err(RpcError::invalid_params(format!(
            "prompt: its attachments hold {total} bytes; a prompt may carry {cap} ([limits] attachment_bytes)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(json: &str) -> serde_json::Map<String, serde_json::Value> {
        serde_json::from_str(json).expect("caps")
    }

    fn prompt(json: &str) -> Box<RawValue> {
        RawValue::from_string(json.to_string()).expect("raw")
    }

    #[test]
    fn blocks_need_the_agents_capability() {
        let image =
            prompt(r#"[{"type":"text","text":"look"},{"type":"image","mimeType":"image/png","data":"iVBORw0K"}]"#);
        let file = prompt(r#"[{"type":"resource","resource":{"uri":"attachment:///a.txt","text":"hello"}}]"#);
        let none = caps(r#"{"promptCapabilities":{"image":false,"embeddedContext":false}}"#);
        let all = caps(r#"{"promptCapabilities":{"image":true,"embeddedContext":true}}"#);
        let e = check(&image, &none, 1 << 20).expect_err("no images");
        assert_eq!(e.code, -32602);
        assert!(
            e.message.contains("prompt[1]") && e.message.contains("promptCapabilities.image"),
            "{}",
            e.message
        );
        let e = check(&file, &caps("{}"), 1 << 20).expect_err("no embedded context");
        assert!(
            e.message.contains("promptCapabilities.embeddedContext"),
            "{}",
            e.message
        );
        check(&image, &all, 1 << 20).expect("images");
        check(&file, &all, 1 << 20).expect("files");
        let link = prompt(r#"[{"type":"resource_link","uri":"https://example.com","name":"x"}]"#);
        check(&link, &none, 0).expect("links are not attachments");
    }

    #[test]
    fn attachments_together_stay_under_the_cap() {
        let all = caps(r#"{"promptCapabilities":{"image":true,"embeddedContext":true}}"#);
        // 8 base64 characters are 6 bytes; "hello" is 5.
        let both = prompt(
            r#"[{"type":"image","mimeType":"image/png","data":"AAAAAAAA"},{"type":"resource","resource":{"uri":"u","text":"hello"}}]"#,
        );
        check(&both, &all, 11).expect("exactly the cap");
        let e = check(&both, &all, 10).expect_err("one byte over");
        assert!(
            e.message.contains("11 bytes") && e.message.contains("[limits] attachment_bytes"),
            "{}",
            e.message
        );
    }

    #[test]
    fn base64_lengths_are_what_it_decodes_to() {
        for n in 0..10usize {
            let encoded = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, vec![1u8; n]);
            assert_eq!(decoded_len(&encoded), n, "{encoded}");
        }
    }

    #[test]
    fn a_prompt_that_is_not_blocks_is_refused() {
        let e = check(&prompt(r#"{"type":"text"}"#), &caps("{}"), 10).expect_err("not an array");
        assert_eq!(e.code, -32602);
    }
}
