// Training text for WriteSyntheticTokenizer's BPE merges.
#pragma once

namespace pd::model::internal {

extern const char kSyntheticTokenizerCorpus[];

}  // namespace pd::model::internal
