"""Reading traced programs in tests: every equation of a jaxpr, nested
ones (scan, while, custom_vjp, pjit bodies) included."""

import jax.extend


def equations(jaxpr):
  """Every equation of `jaxpr` and of the jaxprs nested in it."""
  yield from jaxpr.eqns
  for sub in jax.extend.core.subjaxprs(jaxpr):
    yield from equations(sub)


def dot_operands(jaxpr) -> list[tuple]:
  """The operand avals of every dot_general, nested ones included."""
  return [
    tuple(v.aval for v in eqn.invars)
    for eqn in equations(jaxpr)
    if eqn.primitive.name == "dot_general"
  ]
