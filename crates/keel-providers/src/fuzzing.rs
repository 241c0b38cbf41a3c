//! Entry points for the coverage-guided fuzz targets in `fuzz/` (hidden from the docs, not
//! a stable API): a provider's stream decoder run over response bytes exactly as the
//! driver runs it — framing, then the protocol's decoder — without HTTP.

use keel_core::{ModelError, StreamEvent};
use secrecy::SecretString;

use crate::driver::{Decoder, Protocol};
use crate::framing::{FrameParser, FrameTooLarge};

/// A wire protocol whose streamed answers can be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// Anthropic Messages (SSE).
    Anthropic,
    /// OpenAI Chat Completions (SSE).
    OpenAiChat,
    /// OpenRouter's Chat Completions flavour (SSE).
    OpenRouter,
    /// OpenAI Responses (SSE).
    OpenAiResponses,
    /// Ollama `/api/chat` (NDJSON).
    Ollama,
}

/// Why decoding stopped early.
#[derive(Debug, Clone, PartialEq)]
pub enum DecodeError {
    /// A line or event outgrew the byte limit (the driver's `too_large`).
    Frame(FrameTooLarge),
    /// The decoder classified the stream as failed (malformed chunk, error event,
    /// truncated answer).
    Model(ModelError),
}

/// One attempt's framing and decoder, fed body bytes in chunks.
pub struct StreamDecoder {
    parser: FrameParser,
    decoder: Box<dyn Decoder>,
}

impl std::fmt::Debug for StreamDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamDecoder")
            .field("parser", &self.parser)
            .finish_non_exhaustive()
    }
}

impl StreamDecoder {
    /// A decoder for `wire` whose framing refuses lines or events over `limit` bytes.
    pub fn new(wire: Wire, limit: usize) -> Self {
        let protocol = protocol(wire);
        Self {
            parser: FrameParser::with_limit(protocol.framing(), limit),
            decoder: protocol.decoder(),
        }
    }

    /// Feeds one chunk of the body; pushes the events it completes.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<StreamEvent>) -> Result<(), DecodeError> {
        let frames = self.parser.push(chunk).map_err(DecodeError::Frame)?;
        for frame in frames {
            self.decoder.frame(frame, out).map_err(DecodeError::Model)?;
        }
        Ok(())
    }

    /// The body ended: pushes the final events, or fails when the answer is incomplete.
    pub fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), DecodeError> {
        let frames = self.parser.finish().map_err(DecodeError::Frame)?;
        for frame in frames {
            self.decoder.frame(frame, out).map_err(DecodeError::Model)?;
        }
        self.decoder.end(out).map_err(DecodeError::Model)
    }
}

fn protocol(wire: Wire) -> Box<dyn Protocol> {
    let url = String::new();
    let api_key = SecretString::from(String::new());
    match wire {
        Wire::Anthropic => Box::new(crate::anthropic::Anthropic { url, api_key }),
        Wire::OpenAiChat | Wire::OpenRouter => Box::new(crate::openai_chat::OpenAiChat {
            flavor: if wire == Wire::OpenAiChat {
                crate::openai_chat::Flavor::OpenAi
            } else {
                crate::openai_chat::Flavor::OpenRouter
            },
            url,
            api_key,
            app_url: None,
            app_title: None,
        }),
        Wire::OpenAiResponses => {
            Box::new(crate::openai_responses::OpenAiResponses { url, api_key })
        }
        Wire::Ollama => Box::new(crate::ollama::Ollama { url, api_key: None }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use keel_core::StopReason;

    #[test]
    fn decodes_a_split_anthropic_answer_like_the_driver() {
        let body = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m1\"}}\n\n",
            "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hé\"}}\n\n",
            "data: {\"type\":\"message_stop\"}\n\n",
        )
        .as_bytes();
        let mut whole = Vec::new();
        let mut decoder = StreamDecoder::new(Wire::Anthropic, 1 << 20);
        decoder.push(body, &mut whole).unwrap();
        decoder.finish(&mut whole).unwrap();
        let mut split = Vec::new();
        let mut decoder = StreamDecoder::new(Wire::Anthropic, 1 << 20);
        for byte in body.chunks(1) {
            decoder.push(byte, &mut split).unwrap();
        }
        decoder.finish(&mut split).unwrap();
        assert_eq!(whole, split);
        assert_eq!(whole[0], StreamEvent::TextDelta("hé".into()));
        assert_eq!(
            whole[1],
            StreamEvent::Stop {
                reason: StopReason::EndTurn,
                response_id: Some("m1".into())
            }
        );
    }

    #[test]
    fn a_truncated_ollama_answer_and_an_oversized_line_fail() {
        let mut out = Vec::new();
        let mut decoder = StreamDecoder::new(Wire::Ollama, 64);
        decoder
            .push(b"{\"message\":{\"content\":\"hi\"}}\n", &mut out)
            .unwrap();
        assert!(matches!(
            decoder.finish(&mut out),
            Err(DecodeError::Model(_))
        ));
        let mut decoder = StreamDecoder::new(Wire::OpenAiChat, 8);
        assert!(matches!(
            decoder.push(b"data: 0123456789\n", &mut out),
            Err(DecodeError::Frame(_))
        ));
    }
}
