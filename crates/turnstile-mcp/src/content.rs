//! A tool result's content as turnstile parts.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};

use turnstile_core::agent::ToolError;
use turnstile_core::message::{Attachment, Content, Part};

/// A tool result's content blocks as parts ([`block_parts`]), then its
/// `structuredContent` as a JSON part.
pub(crate) fn result_content(result: &CallToolResult) -> Result<Content, ToolError> {
    let mut parts = block_parts(&result.content)?;
    if let Some(structured) = &result.structured_content {
        let json = serde_json::to_string(structured).unwrap_or_default();
        parts.push(Part::json(json).map_err(|e| ToolError::new(e.to_string()))?);
    }
    Ok(Content::new(parts))
}

/// Content blocks alone as parts ([`block_parts`]).
pub(crate) fn blocks_content(blocks: &[ContentBlock]) -> Result<Content, ToolError> {
    block_parts(blocks).map(Content::new)
}

/// Text as text; images as images (one whose type is no image's, as a
/// file); audio as a file; an embedded text
/// resource as text and a blob as a file (named by its URI); a resource
/// link as a line naming it.
fn block_parts(blocks: &[ContentBlock]) -> Result<Vec<Part>, ToolError> {
    let decode = |data: &str, what: &str| {
        BASE64
            .decode(data)
            .map_err(|_| ToolError::new(format!("the server sent {what} that is not base64")))
    };
    let attachment = |media_type: &str, bytes: Vec<u8>| {
        Attachment::new(media_type, bytes).map_err(|e| {
            ToolError::new(format!(
                "the server sent an attachment turnstile refuses: {e}"
            ))
        })
    };
    let mut parts = Vec::new();
    for block in blocks {
        match block {
            ContentBlock::Text(text) => parts.push(Part::text(text.text.clone())),
            ContentBlock::Image(image) => {
                let file = attachment(&image.mime_type, decode(&image.data, "an image")?)?;
                let is_image = image
                    .mime_type
                    .trim()
                    .to_ascii_lowercase()
                    .starts_with("image/");
                parts.push(match is_image {
                    true => Part::Image(file),
                    false => Part::File(file),
                });
            }
            ContentBlock::Audio(audio) => parts.push(Part::File(attachment(
                &audio.mime_type,
                decode(&audio.data, "audio")?,
            )?)),
            ContentBlock::Resource(embedded) => match &embedded.resource {
                ResourceContents::TextResourceContents { uri, text, .. } => {
                    parts.push(Part::text(format!("{uri}:\n{text}")))
                }
                ResourceContents::BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                    ..
                } => {
                    let media_type = mime_type.as_deref().unwrap_or("application/octet-stream");
                    let file =
                        attachment(media_type, decode(blob, "a resource")?)?.with_name(uri.clone());
                    parts.push(Part::File(file));
                }
                _ => parts.push(Part::text("[a resource of a kind turnstile does not read]")),
            },
            ContentBlock::ResourceLink(link) => parts.push(Part::text(format!(
                "[resource: {} {}]",
                link.name, link.uri
            ))),
            // Kinds added to the protocol later.
            _ => parts.push(Part::text("[content of a kind turnstile does not read]")),
        }
    }
    Ok(parts)
}
