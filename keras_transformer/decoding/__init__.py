"""The decoding stage: the search strategies over a model's cached steps (`strategies`), their
stopping and length rules (`search_rules`), word alignments (`word_alignment`), the in-graph
`Translator` (`translator`), lists of sentences through it from Python and the beam/alpha grid
search (`texts`), translating files (`bulk_translation`), and BLEU/chrF (`evaluation`)."""
