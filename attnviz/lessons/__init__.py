"""The numbers behind the teaching pages, each callable and testable without Streamlit.

`mechanics` (equation 1 by hand, masks, multi-head shapes, the permutation
property), `variants` (sparse patterns, Synthesizer, costs),
`positional` (section 3.5) and `walkthrough` (a forward
pass stage by stage). A lesson may run a model but never loads one: the page hands it the model.
"""
