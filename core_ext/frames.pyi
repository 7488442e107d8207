"""Pulsar frame codec (compiled): split a byte stream into frames, build frames."""

from typing import Final, Literal, final

from typing_extensions import Buffer

DEFAULT_MAX_FRAME_SIZE: Final[int]  # 5 MiB + 10 KiB, the broker's max message size plus padding

class FrameError(ValueError):
    frames: list[Frame] | tuple[()]
    """From ``FrameDecoder.feed``: the complete frames it decoded before the broken one."""

class FrameTooLarge(FrameError): ...
class ChecksumMismatch(FrameError): ...
class MalformedFrame(FrameError): ...

@final
class Frame:
    """A decoded frame; not constructible from Python. Byte fields are copies of the input."""

    @property
    def command(self) -> bytes: ...
    @property
    def broker_entry_metadata(self) -> bytes | None: ...
    @property
    def metadata(self) -> bytes | None:
        """Sliced from ``headers_and_payload`` on first use, then kept."""
    @property
    def payload(self) -> bytes | None:
        """Sliced from ``headers_and_payload`` on first use, then kept."""
    @property
    def headers_and_payload(self) -> bytes | None:
        """From the 0x0e01 checksum magic (or the metadata size, without one) to the end of a
        payload frame: what a broker stores verbatim."""
    @property
    def checksum(self) -> int | None: ...
    @property
    def checksum_valid(self) -> bool | None:
        """None when the frame has no checksum or it was not verified; False only from a
        ``checksum_errors="report"`` decoder."""
    @property
    def is_payload(self) -> bool: ...

@final
class FrameDecoder:
    def __new__(
        cls,
        max_frame_size: int = ...,
        verify_checksum: bool = True,
        checksum_errors: Literal["raise", "report"] = "raise",
    ) -> FrameDecoder:
        """``checksum_errors="report"``: a bad checksum sets the frame's ``checksum_valid``
        to False instead of raising ChecksumMismatch, and decoding goes on."""
    @property
    def buffered(self) -> int: ...
    def feed(self, data: Buffer) -> list[Frame]:
        """Raises FrameError subclasses, carrying the frames decoded before the error in
        ``frames``; after one, every later call raises FrameError."""

def decode_frame(buf: Buffer) -> Frame: ...
def encode_command(command: Buffer) -> bytes: ...
def encode_payload_frame(
    command: Buffer,
    metadata: Buffer,
    payload: Buffer,
    broker_entry_metadata: Buffer | None = None,
) -> bytes: ...
def crc32c(data: Buffer, value: int = 0) -> int:
    """``pyengine_kernels.crc32c`` (google-crc32c's ``extend``), called through its C entry point."""
