// The constraint of a forced Qwen3-Coder call (tool_call_parser.h): the text is
//   <tool_call>\n<function=NAME>\n  (one of the allowed names)
//   then any number of  <parameter=P>\nVALUE</parameter>\n  (P of [A-Za-z0-9_.-], VALUE any text
//   without "</parameter>" or "</tool_call>")
//   then  </function>\n</tool_call>
// which the qwen3_coder parser always reads as a call whose arguments are a JSON object.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/output_constraint.h"

namespace pd::server {

class XmlCallConstraint : public engine::OutputConstraint {
 public:
  XmlCallConstraint(std::shared_ptr<const engine::TokenTexts> texts,
                    const std::vector<std::string>& names);
  std::unique_ptr<engine::ConstraintState> Start() const override;

 private:
  std::vector<std::string> prefixes_;  // "<tool_call>\n<function=NAME>\n" per name
};

}  // namespace pd::server
