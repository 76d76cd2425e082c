"""GradientSync's routes, one file each, behind one protocol (:class:`~.base.Route`): the plain
route (:mod:`.plain`: payloads summed or gathered), TernGrad's scaled codes (:mod:`.scaled_codes`),
PowerSGD's two rounds (:mod:`.low_rank`), the fused compression of a bucket the first two use
(:mod:`.fused`), and the host hierarchy around any of them (:mod:`.hierarchy`)."""
