//! `export CONVERSATION`: the transcript as JSON Lines, exactly. An image's
//! or file's part carries its bytes as base64 (`data`), or, with `--blobs
//! DIR`, names a file of DIR (its SHA-256) written once however many parts
//! name it.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use base64::Engine;

use super::args::ExportArgs;
use super::inspect::{find, PAGE};
use crate::cli::access::Access;
use crate::cli::exit::CliError;
use crate::cli::output;
use crate::cli::store::open_store;
use turnstile::store::TranscriptEntry;
use turnstile::{BlobHash, Error, StoreAdmin};

pub(in crate::cli) async fn export(args: ExportArgs, out: &mut dyn Write) -> Result<(), CliError> {
    if let Some(dir) = &args.blobs {
        if !dir.is_dir() {
            return Err(CliError::Usage(format!(
                "--blobs {} is not a directory: create it first",
                dir.display()
            )));
        }
    }
    let store = open_store(&args.db, Access::Read).await?;
    let result = async {
        let conversation = find(store.as_ref(), args.conversation, args.namespace.as_ref()).await?;
        let mut written = HashSet::new();
        let end = conversation.transcript_entries;
        let mut from = 0;
        while from < end {
            let to = end.min(from + PAGE);
            for entry in store.transcript_range(conversation.id, from, to).await? {
                let line = match &args.blobs {
                    Some(dir) => {
                        write_blobs(store.as_ref(), &entry, dir, &mut written).await?;
                        encoded(&entry)?
                    }
                    None => with_data(store.as_ref(), &entry).await?,
                };
                output::json(out, &line)?;
            }
            from = to;
        }
        out.flush()?;
        Ok(())
    }
    .await;
    crate::cli::store::closed(store.as_ref(), result).await
}

/// A stored attachment's bytes; a part naming bytes the store does not
/// hold is a damaged database.
async fn bytes_of(store: &dyn StoreAdmin, sha256: BlobHash) -> Result<Vec<u8>, CliError> {
    match store.blob(sha256).await? {
        Some(bytes) => Ok(bytes.to_vec()),
        None => Err(Error::Corrupt {
            table: "blobs",
            key: sha256.to_hex(),
            reason: "a message names these bytes and the store does not hold them".into(),
        }
        .into()),
    }
}

fn encoded(entry: &TranscriptEntry) -> Result<serde_json::Value, CliError> {
    serde_json::to_value(entry)
        .map_err(|e| CliError::Failed(format!("cannot encode the entry as json: {e}")))
}

/// The entry as JSON, each image's and file's part with its `data`.
async fn with_data(
    store: &dyn StoreAdmin,
    entry: &TranscriptEntry,
) -> Result<serde_json::Value, CliError> {
    let mut line = encoded(entry)?;
    if let Some(parts) = line["message"]["content"].as_array_mut() {
        for part in parts {
            let Some(hex) = part.get("sha256").and_then(|h| h.as_str()) else {
                continue;
            };
            let bytes = bytes_of(store, BlobHash::from_hex(hex)?).await?;
            part["data"] = base64::engine::general_purpose::STANDARD
                .encode(bytes)
                .into();
        }
    }
    Ok(line)
}

/// Writes the entry's attachments not written yet to `dir`.
async fn write_blobs(
    store: &dyn StoreAdmin,
    entry: &TranscriptEntry,
    dir: &Path,
    written: &mut HashSet<BlobHash>,
) -> Result<(), CliError> {
    for attachment in entry.message.content().attachments() {
        let sha256 = attachment.sha256();
        if !written.insert(sha256) {
            continue;
        }
        let bytes = bytes_of(store, sha256).await?;
        let path = dir.join(sha256.to_hex());
        std::fs::write(&path, bytes).map_err(CliError::io("write an exported blob"))?;
    }
    Ok(())
}
