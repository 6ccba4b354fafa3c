// A Jinja template engine for the chat templates model checkpoints ship, with Hugging Face's
// settings: trim_blocks, lstrip_blocks, loop controls, tojson(ensure_ascii=False) keeping key
// order, and the globals raise_exception, strftime_now, namespace, range and dict.
//
// A template parses once (Parse); an unsupported statement, filter or test is an error naming it
// and its line:column. Render evaluates it over a dict of variables; runtime errors (a template
// that raises, a type error, an undefined attribute) come back as a Status, never a crash.
//
// Thread safety: a Template is immutable after Parse; Render may run from any thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "template/ast.h"
#include "template/value.h"

namespace pd::template_engine {

struct TemplateOptions {
  bool trim_blocks = true;  // as Hugging Face's apply_chat_template sets them
  bool lstrip_blocks = true;
  int max_macro_depth = 64;  // nested macro calls before a render fails
};

class Template {
 public:
  static Result<std::unique_ptr<Template>> Parse(std::string_view source,
                                                 const TemplateOptions& options = {});
  // `context` is a dict of variables (non-dict: InvalidArgument).
  Result<std::string> Render(const Value& context) const;

 private:
  Template(Body body, TemplateOptions options)
      : body_(std::move(body)), options_(std::move(options)) {}
  Body body_;
  TemplateOptions options_;
};

}  // namespace pd::template_engine
