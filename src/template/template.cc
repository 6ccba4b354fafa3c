#include "template/template.h"

#include "template/lexer.h"
#include "template/parser.h"
#include "template/renderer.h"

namespace pd::template_engine {

Result<std::unique_ptr<Template>> Template::Parse(std::string_view source,
                                                  const TemplateOptions& options) {
  LexerOptions lexer_options;
  lexer_options.trim_blocks = options.trim_blocks;
  lexer_options.lstrip_blocks = options.lstrip_blocks;
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source, lexer_options));
  ASSIGN_OR_RETURN(Body body, template_engine::Parse(std::move(tokens)));
  return std::unique_ptr<Template>(new Template(std::move(body), options));
}

Result<std::string> Template::Render(const Value& context) const {
  if (!context.is_object()) {
    return InvalidArgument("template context must be a dict, not " + context.TypeName());
  }
  Renderer renderer(options_, context);
  return renderer.Run(body_);
}

}  // namespace pd::template_engine
