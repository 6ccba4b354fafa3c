#include "template/template.h"

#include <gtest/gtest.h>

namespace pd::template_engine {
namespace {

// Renders `source` (HF settings) over the JSON object `context`; errors come back as
// "ERROR: <message>".
std::string Render(std::string_view source, std::string_view context = "{}") {
  auto tmpl = Template::Parse(source);
  if (!tmpl.ok()) return "ERROR: " + tmpl.status().message();
  auto out = (*tmpl)->Render(Value::FromJson(nlohmann::ordered_json::parse(context)));
  if (!out.ok()) return "ERROR: " + out.status().message();
  return *out;
}

TEST(Template, TextAndOutput) {
  EXPECT_EQ(Render("hello"), "hello");
  EXPECT_EQ(Render("{{ 'a' }}{{ 1 }}{{ 1.5 }}{{ none }}{{ true }}"), "a11.5NoneTrue");
  EXPECT_EQ(Render("{{ x }}", R"({"x": "y"})"), "y");
  EXPECT_EQ(Render("[{{ missing }}]"), "[]");
  EXPECT_EQ(Render("{{ [1, 'a'] }} {{ {'k': none} }}"), "[1, 'a'] {'k': None}");
}

TEST(Template, IfElifElse) {
  const char* t = "{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}";
  EXPECT_EQ(Render(t, R"({"x": 1})"), "one");
  EXPECT_EQ(Render(t, R"({"x": 2})"), "two");
  EXPECT_EQ(Render(t, R"({"x": 3})"), "many");
}

TEST(Template, ForLoopVariables) {
  EXPECT_EQ(Render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
                   "{{ loop.length }}{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %}"
                   ",{% endfor %}",
                   R"({"xs": ["a", "b"]})"),
            "1022F,2112L,");
  EXPECT_EQ(Render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
                   R"({"d": {"b": 1, "a": 2}})"),
            "b=1;a=2;");
  EXPECT_EQ(Render("{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% endfor %}",
                   R"({"xs": [1, 2, 3]})"),
            "2232");
  EXPECT_EQ(
      Render("{% for x in xs %}{{ loop.cycle('a', 'b') }}{% endfor %}", R"({"xs": [1, 2, 3]})"),
      "aba");
}

TEST(Template, LoopControls) {
  EXPECT_EQ(Render("{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}"
                   "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "13");
  EXPECT_EQ(Render("{% break %}"), "ERROR: template 1:4: 'break' outside of a for loop");
}

TEST(Template, SetScopingAndNamespace) {
  EXPECT_EQ(Render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(Render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}"
                   "{% endfor %}{{ ns.x }}"),
            "4");
  EXPECT_EQ(Render("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(Render("{% set x %}block {{ 1 + 1 }}{% endset %}[{{ x }}]"), "[block 2]");
  EXPECT_EQ(Render("{% set x | upper %}abc{% endset %}{{ x }}"), "ABC");
  EXPECT_EQ(Render("{% set d = {} %}{% set d.x = 1 %}"),
            "ERROR: template 1:20: cannot assign attribute on non-namespace object 'd'");
}

TEST(Template, MacroAndCall) {
  EXPECT_EQ(Render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                   "{{ greet('a') }} {{ greet('b', punct='?') }}"),
            "Hi a! Hi b?");
  EXPECT_EQ(Render("{% macro wrap() %}[{{ caller() }}]{% endmacro %}"
                   "{% call wrap() %}inner{% endcall %}"),
            "[inner]");
  EXPECT_EQ(Render("{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}"
                   "{% call(x) each([1, 2]) %}<{{ x }}>{% endcall %}"),
            "<1><2>");
  EXPECT_EQ(Render("{% macro r(n) %}{{ r(n) }}{% endmacro %}{{ r(1) }}").substr(0, 6), "ERROR:");
}

TEST(Template, FilterBlock) {
  EXPECT_EQ(Render("{% filter upper %}abc{{ 'd' }}{% endfilter %}"), "ABCD");
  EXPECT_EQ(Render("{% filter trim | upper %}  x  {% endfilter %}"), "X");
}

TEST(Template, Arithmetic) {
  EXPECT_EQ(Render("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }}"
                   " {{ 2 ** 10 }} {{ 1 - 0.5 }} {{ -x }}",
                   R"({"x": 4})"),
            "7 3 -4 1 2 3.5 1024 0.5 -4");
  EXPECT_EQ(Render("{{ 'a' + 'b' }}{{ 'a' ~ 1 ~ none }}{{ [1] + [2] }}{{ 'ab' * 2 }}"),
            "aba1None[1, 2]abab");
  EXPECT_EQ(Render("{{ 1 / 0 }}"), "ERROR: template 1:6: division by zero");
  EXPECT_EQ(Render("{{ 'a' + 1 }}"),
            "ERROR: template 1:8: unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_EQ(Render("{{ '%s-%d' % ('a', 3) }}"), "a-3");
}

TEST(Template, ComparisonAndLogic) {
  EXPECT_EQ(Render("{{ 1 < 2 }}{{ 'b' > 'a' }}{{ 1 == 1.0 }}{{ 2 >= 3 }}{{ 'a' != 'a' }}"),
            "TrueTrueTrueFalseFalse");
  EXPECT_EQ(Render("{{ 'a' in 'cat' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 3 not in [3] }}"),
            "TrueTrueTrueFalse");
  EXPECT_EQ(Render("{{ none or 'x' }}{{ 0 and 1 }}{{ not none }}"), "x0True");
  EXPECT_EQ(Render("{{ 'y' if x else 'n' }}{{ 'z' if not x }}", R"({"x": false})"), "nz");
}

TEST(Template, Tests) {
  EXPECT_EQ(Render("{{ x is defined }}{{ y is undefined }}{{ n is none }}{{ x is string }}"
                   "{{ d is mapping }}{{ l is iterable }}{{ 1 is number }}{{ l is sequence }}"
                   "{{ t is boolean }}{{ t is true }}{{ t is false }}{{ 3 is equalto 3 }}"
                   "{{ 3 is equalto(4) }}{{ n is not none }}{{ 4 is even }}{{ 1.5 is float }}",
                   R"({"x": "s", "n": null, "d": {}, "l": [], "t": true})"),
            "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueFalseFalseTrueTrue");
}

TEST(Template, AttributeItemAndSlicing) {
  const char* ctx = R"({"m": {"role": "user", "list": [1, 2, 3, 4]}, "s": "héllo"})";
  EXPECT_EQ(Render("{{ m.role }}{{ m['role'] }}{{ m.list[1] }}{{ m.list[-1] }}", ctx),
            "useruser24");
  EXPECT_EQ(Render("{{ m.list[::-1] }}{{ m.list[1:3] }}{{ m.list[:-1] }}{{ m.list[::2] }}", ctx),
            "[4, 3, 2, 1][2, 3][1, 2, 3][1, 3]");
  EXPECT_EQ(Render("{{ s[::-1] }}{{ s[1:3] }}{{ s[1] }}", ctx), "olléhélé");
  EXPECT_EQ(Render("[{{ m.missing }}]{{ m.missing is defined }}", ctx), "[]False");
  EXPECT_EQ(Render("{{ m.missing.deeper }}", ctx).substr(0, 20), "ERROR: template 1:13");
}

TEST(Template, StringMethods) {
  EXPECT_EQ(Render("{{ s.startswith('<a') }}{{ s.endswith(('x', '>')) }}{{ s.split('>')[1] }}"
                   "|{{ '  p  '.strip() }}|{{ '\\n\\nq'.lstrip('\\n') }}|{{ 'r  '.rstrip() }}|"
                   "{{ s.replace('a', 'b') }}{{ 'a b  c'.split() }}{{ 'AbC'.lower() }}"
                   "{{ 'x'.upper() }}{{ '-'.join(['1', '2']) }}",
                   R"({"s": "<a>b"})"),
            "TrueFalseb|p|q|r|<b>b['a', 'b', 'c']abcX1-2");
  EXPECT_EQ(Render("{{ d.get('a') }}{{ d.get('z', 5) }}{{ d.keys() }}{{ d.values() }}",
                   R"({"d": {"a": 1}})"),
            "15['a'][1]");
  EXPECT_EQ(Render("{{ 'x'.nosuch() }}"),
            "ERROR: template 1:7: 'str' object has no attribute 'nosuch'");
}

TEST(Template, Filters) {
  EXPECT_EQ(Render("{{ '  a ' | trim }}{{ 'ab' | length }}{{ 'é' | length }}{{ [1, 2] | count }}"
                   "{{ ['a', 'b'] | join(',') }}{{ 'aB' | lower }}{{ 'ab' | upper }}"
                   "{{ 'hello world' | title }}{{ 'hELLO' | capitalize }}"
                   "{{ 'aaa' | replace('a', 'b', 2) }}"),
            "a212a,babABHello WorldHellobba");
  EXPECT_EQ(
      Render("{{ d | items | list }}{{ [3, 1, 2] | sort }}{{ [3, 1, 2] | sort(reverse=true) }}"
             "{{ [1, 2] | first }}{{ [1, 2] | last }}{{ [1, 1, 2] | unique | list }}"
             "{{ [1, 2] | reverse | list }}{{ {'b': 1, 'a': 2} | dictsort }}",
             R"({"d": {"k": "v"}})"),
      "[('k', 'v')][1, 2, 3][3, 2, 1]12[1, 2][2, 1][('a', 2), ('b', 1)]");
  EXPECT_EQ(
      Render("{{ x | default('d') }}{{ '' | default('e', true) }}{{ '' | d('f') }}"
             "{{ '12' | int + 1 }}{{ '1.5' | float }}{{ -3 | abs }}{{ 2.567 | round(2) }}"
             "{{ 3 | string }}{{ '<a>' | safe }}{{ '<&>' | escape }}{{ '%s!' | format('x') }}"),
      "de131.532.573<a>&lt;&amp;&gt;x!");
  EXPECT_EQ(Render("{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}"),
            "a\n  b\n\n  c|  a\n  b");
}

TEST(Template, SelectAttrAndMap) {
  const char* ctx = R"({"ms": [{"role": "system", "n": 1}, {"role": "user", "n": 2},
                               {"role": "user"}]})";
  EXPECT_EQ(
      Render("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='n') | list }}", ctx),
      "[2, ]");  // map yields an undefined for the missing attribute
  EXPECT_EQ(Render("{{ ms | rejectattr('role', 'equalto', 'user') | list | length }}", ctx), "1");
  EXPECT_EQ(Render("{{ ms | selectattr('n') | list | length }}", ctx), "2");
  EXPECT_EQ(Render("{{ ['a', 'B'] | map('upper') | join }}", ctx), "AB");
}

TEST(Template, ToJson) {
  const char* ctx = R"({"t": {"name": "f", "desc": "héllo \"q\"\n", "args": [1, 2.5, true, null],
                            "z": {}}})";
  EXPECT_EQ(Render("{{ t | tojson }}", ctx),
            R"({"name": "f", "desc": "héllo \"q\"\n", "args": [1, 2.5, true, null], "z": {}})");
  EXPECT_EQ(Render("{{ t.args | tojson(indent=2) }}", ctx), "[\n  1,\n  2.5,\n  true,\n  null\n]");
  EXPECT_EQ(Render("{{ 'é' | tojson(ensure_ascii=true) }}", ctx), R"("\u00e9")");
  EXPECT_EQ(Render("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}", ctx), R"({"a": 2, "b": 1})");
  EXPECT_EQ(Render("{{ x | tojson }}").substr(0, 22), "ERROR: template 1:8: f");
}

TEST(Template, WhitespaceControl) {
  EXPECT_EQ(Render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(Render("a {{- 'b' -}} c"), "abc");
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(Render("{% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  // As Jinja: one newline at the end of the template is dropped, \r\n and \r become \n.
  EXPECT_EQ(Render("  {{ 'v' }}\n"), "  v");
  EXPECT_EQ(Render("a\r\nb\rc\n\n"), "a\nb\nc\n");
  EXPECT_EQ(Render("a{# comment #}\nb"), "ab");
  EXPECT_EQ(Render("  {%+ if true %}x{% endif %}"), "  x");
}

TEST(Template, Globals) {
  EXPECT_EQ(Render("{{ raise_exception('bad role') }}"),
            "ERROR: template 1:4: raise_exception: bad role");
  EXPECT_EQ(Render("{{ strftime_now('%Y') | length }}"), "4");
  EXPECT_EQ(Render("{{ range(3) | list }}{{ range(1, 7, 2) | list }}{{ dict(a=1) }}"),
            "[0, 1, 2][1, 3, 5]{'a': 1}");
  EXPECT_EQ(Render("{{ nosuch() }}"), "ERROR: template 1:4: 'nosuch' is undefined");
}

TEST(Template, LoadTimeErrors) {
  EXPECT_EQ(Render("{{ x | nofilter }}"), "ERROR: template 1:8: unknown filter 'nofilter'");
  EXPECT_EQ(Render("{{ x is notatest }}"), "ERROR: template 1:9: unknown test 'notatest'");
  EXPECT_EQ(Render("\n{% include 'x' %}"), "ERROR: template 2:4: unsupported statement 'include'");
  EXPECT_EQ(Render("{% if x %}"),
            "ERROR: template 1:4: missing '{% endif %}' for the block that starts here");
  EXPECT_EQ(Render("{{ x "), "ERROR: template 1:1: unclosed tag '{{'");
  EXPECT_EQ(Render("{{ 'abc }}"), "ERROR: template 1:4: unclosed string literal");
  EXPECT_EQ(Render("{{ x $ }}"), "ERROR: template 1:6: unexpected character '$'");
  EXPECT_EQ(Render("{# never closed"), "ERROR: template 1:1: unclosed comment '{#'");
  EXPECT_EQ(Render("{{ (1 }}"), "ERROR: template 1:7: expected ')', got '}}'");
  EXPECT_EQ(Render("{% endfor %}"), "ERROR: template 1:4: unsupported statement 'endfor'");
}

TEST(Template, DeepNestingIsAnErrorNotACrash) {
  const std::string parens = std::string(100000, '(') + "1" + std::string(100000, ')');
  // Each parenthesis is a few levels of the grammar: the limit falls inside the first hundred.
  EXPECT_EQ(Render("{{ " + parens + " }}"),
            "ERROR: template 1:89: expression nested deeper than 256");
  std::string nots = "{{ ";
  for (int i = 0; i < 100000; ++i) nots += "not ";
  EXPECT_EQ(Render(nots + "x }}"), "ERROR: template 1:1024: expression nested deeper than 256");
  std::string ifs;
  for (int i = 0; i < 100000; ++i) ifs += "{% if x %}";
  EXPECT_EQ(Render(ifs), "ERROR: template 1:" + std::to_string(1 + 10 * 256 + 3) +
                             ": blocks nested deeper than 256");
  // Within the limits, nesting works.
  EXPECT_EQ(Render("{{ " + std::string(50, '(') + "2" + std::string(50, ')') + " }}"), "2");
}

TEST(Template, MoreRuntimeErrors) {
  EXPECT_EQ(Render("{% macro m() %}{{ raise_exception('in macro') }}{% endmacro %}{{ m() }}"),
            "ERROR: template 1:19: raise_exception: in macro");
  EXPECT_EQ(Render("{% for a, b in [1] %}{% endfor %}"),
            "ERROR: template 1:4: cannot unpack int into 2 names");
  EXPECT_EQ(Render("{{ ['a'] | map('nofilter') | list }}"),
            "ERROR: template 1:12: filter 'map': unknown filter 'nofilter'");
  EXPECT_EQ(Render("{{ [1][::0] }}"), "ERROR: template 1:7: slice step cannot be zero");
  EXPECT_EQ(Render("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(Template, TuplesPrintAsPython) {
  EXPECT_EQ(Render("{{ (1, 'a') }}{{ (1,) }}{{ {'k': 1}.items() | list }}"),
            "(1, 'a')(1,)[('k', 1)]");
  EXPECT_EQ(Render("{{ (1, 2) | tojson }}{{ (1, 2) | list }}"), "[1, 2][1, 2]");
}

TEST(Template, IntegerOverflowIsAnError) {
  EXPECT_EQ(Render("{{ 2 ** 62 }}{{ (-1) ** 1000000000001 }}{{ 1 ** 1000000000000 }}"),
            "4611686018427387904-11");
  EXPECT_EQ(Render("{{ 2 ** 64 }}"),
            "ERROR: template 1:6: integer overflow in '**' (beyond 64 bits)");
  EXPECT_EQ(Render("{{ 9223372036854775807 + 1 }}"),
            "ERROR: template 1:24: integer overflow in '+' (beyond 64 bits)");
}

TEST(Template, RuntimeErrors) {
  EXPECT_EQ(Render("{{ x.y }}"), "ERROR: template 1:5: 'x' is undefined");
  EXPECT_EQ(Render("{% for x in 3 %}{% endfor %}"),
            "ERROR: template 1:13: 'int' object is not iterable");
  EXPECT_EQ(Render("{{ 1 < 'a' }}"),
            "ERROR: template 1:6: '<' not supported between instances of 'int' and 'str'");
  EXPECT_EQ(Render("{{ 5 | length }}"), "ERROR: template 1:8: object of type 'int' has no len()");
}

}  // namespace
}  // namespace pd::template_engine
