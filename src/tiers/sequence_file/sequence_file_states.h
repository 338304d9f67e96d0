#pragma once

// What a sequence file records of a state slot (docs/layout.md, "Sequence files"): one record per state tensor,
// written and read, checked and compared. No file I/O.

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/tiers/sequence_file.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvcache::rt::detail
{

//! Bytes of one state tensor record (version 3): stateLayer, tensor, dataType, number of dimensions (int32 each),
//! slotBytes, then kMAX_STATE_DIMS extents (int64 each, 0 past the tensor's dimensions).
constexpr int64_t kSEQUENCE_STATE_RECORD_BYTES = 80;
//! More state tensors than any model has; bounds what a corrupt count can make the reader allocate.
constexpr int32_t kMAX_FILE_STATE_TENSORS = 1 << 16;

//! Writes the records of `tensors` (checked by checkStateTensors) into `header` from byte `at`, one after another.
void encodeStateTensors(std::vector<SequenceStateTensor> const& tensors, int64_t at, std::vector<char>& header);

//! Reads `count` records (in [0, kMAX_FILE_STATE_TENSORS]) from byte `statesAt` of `header`. Throws
//! InvalidArgumentError naming `prefix`, the record, the value and the limit for a number of dimensions outside
//! [1, kMAX_STATE_DIMS] or an extent past them other than 0; the rest is for checkStateTensors.
std::vector<SequenceStateTensor> decodeStateTensors(
    std::string const& prefix, std::vector<char> const& header, int64_t statesAt, int32_t count);

//! Throws InvalidArgumentError, naming `prefix`, `field`[i] and the member, its value and the limit, for state tensors
//! sequenceStateTensors would not give: more than kMAX_FILE_STATE_TENSORS, out of order (the first is state layer 0
//! tensor 0, each next one the next tensor of its layer or tensor 0 of the next layer), a data type that is not one,
//! 0 or more than kMAX_STATE_DIMS extents, an extent <= 0, slotBytes other than the shape implies, or bytes that
//! leave int64. Returns the sum of their slotBytes.
int64_t checkStateTensors(
    std::string const& prefix, char const* field, std::vector<SequenceStateTensor> const& tensors);

//! Throws InvalidArgumentError naming the first difference between the file's state tensors and the expected ones
//! (their count, then tensor by tensor), with the file's value and the expected one.
void expectStateTensors(char const* what, std::string const& path, std::vector<SequenceStateTensor> const& file,
    std::vector<SequenceStateTensor> const& expected);

} // namespace kvcache::rt::detail
