//! Training data: prompts from packaged corpora, answers and hidden states from the target.
