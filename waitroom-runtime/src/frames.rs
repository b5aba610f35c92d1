//! The gossip transport: one [`Message`] frame per QUIC stream direction.
//!
//! The frame format and its codec are in [`waitroom_common::wire`]; this adds
//! only the reading and writing on quinn streams, and the errors those add.
use waitroom_common::wire::{self, HEADER_LEN, Message, Refusal, WireError};

/// Why a frame could not be read from or written to a stream.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("stream ended early: {source}")]
    Read { source: quinn::ReadExactError },
    #[error("writing the frame: {source}")]
    Write { source: quinn::WriteError },
    #[error("stream closed: {source}")]
    Closed { source: quinn::ClosedStream },
}

impl FrameError {
    /// The refusal to send back, when the peer's bytes were at fault (not
    /// when the stream itself failed).
    #[must_use]
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Self::Wire(err) => Some(err.refusal()),
            Self::Read { .. } | Self::Write { .. } | Self::Closed { .. } => None,
        }
    }

    /// The QUIC close code matching this error.
    #[must_use]
    pub fn close_code(&self) -> u32 {
        match self {
            Self::Wire(err) => err.close_code(),
            _ => wire::close::MALFORMED,
        }
    }
}

/// Reads one frame from a stream: the header first, so a bad version or an
/// oversized length is refused before a byte of payload is buffered.
pub async fn read(recv: &mut quinn::RecvStream) -> Result<Message, FrameError> {
    Ok(read_sized(recv).await?.0)
}

/// [`read`], and the frame's length in bytes (header and payload).
pub async fn read_sized(recv: &mut quinn::RecvStream) -> Result<(Message, usize), FrameError> {
    read_next_sized(recv).await?.ok_or(FrameError::Read {
        source: quinn::ReadExactError::FinishedEarly(0),
    })
}

/// The next frame, or `None` when the stream ends before it: after an
/// answer, its [`wire::Message::Note`] if any (an aggregator that predates
/// notes, or has nothing to add, finishes after one frame).
pub async fn read_next(recv: &mut quinn::RecvStream) -> Result<Option<Message>, FrameError> {
    Ok(read_next_sized(recv).await?.map(|(message, _)| message))
}

/// [`read_next`], and the frame's length in bytes.
async fn read_next_sized(
    recv: &mut quinn::RecvStream,
) -> Result<Option<(Message, usize)>, FrameError> {
    let mut header = [0; HEADER_LEN];
    match recv.read_exact(&mut header).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(source) => return Err(FrameError::Read { source }),
    }
    let len = wire::decode_header(&header)?;
    let mut payload = vec![0; len];
    recv.read_exact(&mut payload)
        .await
        .map_err(|source| FrameError::Read { source })?;
    Ok(Some((wire::decode_payload(&payload)?, HEADER_LEN + len)))
}

/// Writes one frame and finishes the stream (one frame per stream direction).
pub async fn write(send: &mut quinn::SendStream, message: &Message) -> Result<(), FrameError> {
    write_all(send, std::slice::from_ref(message)).await
}

/// Writes `messages`, one frame each, and finishes the stream (an answer
/// and its [`wire::Message::Note`]).
pub async fn write_all(
    send: &mut quinn::SendStream,
    messages: &[Message],
) -> Result<(), FrameError> {
    // One buffer, the first frame's own: a single answer is not copied.
    let mut frames = Vec::new();
    for message in messages {
        let frame = wire::encode(message)?;
        if frames.is_empty() {
            frames = frame;
        } else {
            frames.extend_from_slice(&frame);
        }
    }
    send.write_all(&frames)
        .await
        .map_err(|source| FrameError::Write { source })?;
    send.finish()
        .map_err(|source| FrameError::Closed { source })
}
