// The small training corpus of synthetic tokenizers: plain English prose and a little code,
// written for pdserve, so learned merges compress ordinary prompts.
#include "model/tokenizer_corpus.h"

namespace pd::model::internal {

const char kSyntheticTokenizerCorpus[] = R"CORPUS(
The quick brown fox jumps over the lazy dog. The dog did not move, and the fox ran into the
forest before the sun went down. In the morning the farmer found the gate open and the hens
gone, so he walked along the river to look for them. It was a long day, but by the evening
every hen was back in the yard and the gate was closed again.

A language model reads a sequence of tokens and predicts the next one. Each token is a piece
of text: a whole word, part of a word, a number, a space or a single byte. The model turns the
tokens into vectors, mixes them with attention, and produces a probability for every token in
its vocabulary. Sampling picks one of them, appends it to the sequence, and the process starts
again. This is how a model writes an answer one token at a time.

Serving many users at once is a matter of scheduling. Requests arrive at different times and
with prompts of different lengths. The server keeps a batch of running sequences, adds new
ones when there is room in the cache, and removes those that have finished. The prefill of a
long prompt is heavy on compute, while decoding is limited by memory bandwidth, so it often
helps to run the two phases on different machines and to move the cache between them.

Once upon a time there was a little town on the side of a hill. The people of the town were
known for their bread, which they baked every morning in a large stone oven in the square.
Travellers came from far away to buy it, and the town grew rich. One winter the oven cracked,
and nobody knew how to repair it. The children of the town, who had watched the old baker for
years, gathered stones from the river and built a new oven together. The bread it made was
even better than before, and the town remembered that winter for a hundred years.

Questions and answers:
What is the capital of France? The capital of France is Paris.
How many days are there in a week? There are seven days in a week.
Why is the sky blue? Sunlight is scattered by the air, and blue light is scattered the most.
Can you write a short poem about the sea? The sea is wide, the sea is deep, it sings the
sailors all to sleep.
Please summarize the following text in one sentence. The text says that the project will be
finished next month if the weather stays good and the team keeps working at the same speed.

Numbers and dates: 1, 2, 3, 10, 20, 100, 2024, 3.14159, 42 percent, on the 5th of May, at
10:30 in the morning, version 1.2.3, 0.001, 1e-6, and 65536.

def fibonacci(n):
    """Returns the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def main():
    values = [fibonacci(i) for i in range(10)]
    print("values:", values)
    if len(values) > 5:
        print("the list is long")
    return 0


if __name__ == "__main__":
    main()

#include <iostream>
#include <string>
#include <vector>

// Returns the sum of the values in the vector.
int Sum(const std::vector<int>& values) {
  int total = 0;
  for (int value : values) {
    total += value;
  }
  return total;
}

int main(int argc, char** argv) {
  std::vector<int> values = {1, 2, 3, 4, 5};
  std::string name = argc > 1 ? argv[1] : "world";
  std::cout << "Hello, " << name << "! The sum is " << Sum(values) << std::endl;
  return 0;
}

{"model": "pdserve", "messages": [{"role": "user", "content": "Hello! How are you today?"}],
 "max_tokens": 16, "temperature": 0.7, "stream": true}

The history of writing is the history of how people learned to keep their words. Long before
paper, marks were pressed into clay and cut into stone. Later came ink and paper, then the
printing press, which made books cheap enough for many people to own. Today most text is
stored as numbers in a computer, and every letter, digit and symbol has its own code. A
tokenizer is the part of a language model that decides how that text is cut into pieces.
Good tokenizers keep common words whole and split rare words into smaller parts, so that the
model sees short sequences for ordinary text and can still read anything it is given.

Thank you for your question. I would be happy to help. Here is what I found: the meeting has
been moved to Thursday afternoon, and the report should be sent to the whole team by Friday.
If you have any other questions, please let me know and I will do my best to answer them.
)CORPUS";

}  // namespace pd::model::internal
