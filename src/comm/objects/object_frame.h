#pragma once

// How the object collectives frame what they send (private header): a
// 32-byte header (magic, kind, payload length, payload checksum) before the
// payload, so that a damaged or truncated object is a clear error at the
// receiver instead of whatever the unpickler makes of it. See Note [Object
// frames] in object_frame.cpp.

#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp::internal {

enum class ObjectKind : uint64_t { kIValue = 1, kBytes = 2 };

constexpr size_t kObjectHeaderBytes = 32;

// Header + payload.
std::string frame_object(ObjectKind kind, const void* payload, size_t size);

// The payload of the frame `data[0..size)`, checked; throws c10::Error
// "<who>: the object from <from> is damaged: ..." otherwise.
std::string unframe_object(const uint8_t* data, size_t size, ObjectKind expected, const std::string& who,
                           const std::string& from);

// An IValue pickled (torch::jit::pickle_save) and framed, and back.
std::string encode_ivalue(const c10::IValue& value);
c10::IValue decode_ivalue(const uint8_t* data, size_t size, const std::string& who, const std::string& from);

} // namespace ddp::internal
