"""Encoders and decoders for the two channels; msgspec msgpack, never pickle."""

from __future__ import annotations

import logging

import msgspec

from ipc.messages import Broadcast, Reply

logger = logging.getLogger(__name__)

# The bound on one message on every tprun socket (the broadcast and reply
# channels, the engine endpoint): each socket sets it as ZeroMQ's MAXMSGSIZE,
# so a peer that sends a larger frame is cut before anything reads it.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
# The most pooled float32 bytes one message carries (a pooling step's reply,
# the deltas one client gets at once): half the bound, the other half left
# for the rest of the message. A token-level pooling request's rows (one a
# prompt token) travel whole in its last delta, so one whose rows exceed it
# is refused (``LLMEngine.new_pooling_request``).
MAX_POOLED_BYTES = MAX_MESSAGE_BYTES // 2

_encoder = msgspec.msgpack.Encoder()
_broadcast_decoder = msgspec.msgpack.Decoder(Broadcast)
_reply_decoder = msgspec.msgpack.Decoder(Reply)


def encode(message: msgspec.Struct) -> bytes:
    """Encode any message of ``ipc.messages`` to bytes."""
    return _encoder.encode(message)


def decode_broadcast(data: bytes) -> Broadcast | None:
    """Decode a broadcast message, or log and return None if malformed."""
    try:
        return _broadcast_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        logger.warning("dropped malformed broadcast message (%d bytes): %s", len(data), e)
        return None


def decode_reply(data: bytes) -> Reply | None:
    """Decode a reply message, or log and return None if malformed."""
    try:
        return _reply_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        logger.warning("dropped malformed reply message (%d bytes): %s", len(data), e)
        return None
