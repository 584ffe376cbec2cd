"""The real text the `text` scenario's prompts are made of: short passages of prose, notices,
recipes and code (written for this project, free to reuse), and open-question topics.

Passages are what a copy-heavy request quotes (a RAG answer citing its document, a summary,
a code edit); topics are what an open question asks about (an answer that reuses little of
its prompt). The last passages and topics are kept for the warm-up, so a measured request
never shares a passage with a warm-up one.
"""

from __future__ import annotations

PASSAGES: tuple[str, ...] = (
    "The lighthouse on the northern cape was built in 1871 from granite quarried two miles inland. "
    "Its lamp burned paraffin until 1932, when an electric lamp and a rotating lens replaced it. "
    "Keepers lived in the cottage at its foot with their families, and each night one of them climbed "
    "the one hundred and twelve steps every four hours to wind the clockwork that turned the lens. "
    "The light was automated in 1986 and the last keeper moved to the village.",

    "To return an item, pack it in its original box with every accessory and the receipt. Print the "
    "return label from your order page and attach it to the outside of the parcel. Drop the parcel at "
    "any post office within thirty days of delivery. Refunds are paid to the card used for the order "
    "within five working days of the item reaching our warehouse. Items that were opened, used or "
    "damaged may be refused, and personalised items cannot be returned.",

    "def average(values):\n    \"\"\"Return the arithmetic mean of a list of numbers.\"\"\"\n"
    "    if not values:\n        raise ValueError(\"average of an empty list\")\n    total = 0\n"
    "    for value in values:\n        total += value\n    return total / len(values)\n",

    "Tides are caused mainly by the pull of the Moon on the oceans. The water on the side of the Earth "
    "facing the Moon is pulled towards it, and the water on the far side is left behind, so most coasts "
    "see two high tides and two low tides a day. When the Sun and the Moon line up, at new and full "
    "moon, their pulls add together and the tides are larger; these are called spring tides. When they "
    "pull at right angles, the tides are smaller; these are called neap tides.",

    "Minutes of the committee meeting held on the third of March. Present: the chair, the treasurer and "
    "four members. The treasurer reported that the roof repair cost less than expected and that the "
    "reserve fund now stands at four thousand pounds. The committee agreed to replace the hall's heating "
    "before next winter and asked the chair to collect three quotes. The summer fair will be held on the "
    "second Saturday of July. The meeting closed at nine o'clock.",

    "SELECT customers.name, COUNT(orders.id) AS order_count\nFROM customers\n"
    "JOIN orders ON orders.customer_id = customers.id\nWHERE orders.created_at >= '2024-01-01'\n"
    "GROUP BY customers.name\nHAVING COUNT(orders.id) > 5\nORDER BY order_count DESC;\n",

    "To make a simple loaf of bread, mix five hundred grams of strong flour with ten grams of salt and "
    "seven grams of dried yeast. Add three hundred and twenty millilitres of warm water and mix until a "
    "dough forms. Knead it for ten minutes until it is smooth and springy, then leave it covered in a "
    "warm place for an hour, until it has doubled in size. Shape it, put it in a tin, let it rise for "
    "another half hour and bake it at two hundred degrees for thirty minutes.",

    "Honey bees live in colonies of up to sixty thousand insects. A colony has one queen, who lays all "
    "the eggs, a few hundred male drones, and thousands of female workers. Workers clean the hive, feed "
    "the young, build wax comb and guard the entrance; the oldest workers fly out to gather nectar and "
    "pollen. A worker who finds a good patch of flowers returns and dances on the comb, and the angle and "
    "length of her dance tell the others the direction and distance of the flowers.",

    "Service notice: from Monday the ninth, the number 14 bus will not stop at Market Street while the "
    "road is resurfaced. Passengers should use the temporary stop on Bridge Road, about two hundred "
    "metres to the east. Buses will run every twelve minutes during the day and every twenty minutes "
    "after seven in the evening. The works are expected to last three weeks. We are sorry for the "
    "inconvenience and thank passengers for their patience.",

    "def is_palindrome(text):\n    \"\"\"Return True if text reads the same forwards and backwards.\"\"\"\n"
    "    cleaned = [c.lower() for c in text if c.isalnum()]\n    left, right = 0, len(cleaned) - 1\n"
    "    while left < right:\n        if cleaned[left] != cleaned[right]:\n            return False\n"
    "        left += 1\n        right -= 1\n    return True\n",

    "The printing press with movable type reached Europe in the middle of the fifteenth century. Before "
    "it, books were copied by hand, which took months for a single volume and made books rare and "
    "expensive. A press could print hundreds of identical pages in a day. Within fifty years there were "
    "printers in more than two hundred European towns, and millions of books had been printed. Cheaper "
    "books spread new ideas quickly and helped more people learn to read.",

    "Volcanoes form where molten rock, called magma, rises from deep inside the Earth. Most of them lie "
    "along the edges of the tectonic plates, where one plate sinks beneath another or where two plates "
    "pull apart. When the pressure of gas in the magma becomes too great, the volcano erupts. Some "
    "eruptions are gentle, with rivers of lava flowing down the slopes; others are explosive and throw "
    "ash and rock high into the sky, where the wind can carry the ash for hundreds of miles.",

    "To keep a bicycle running well, check the tyre pressure every week and pump the tyres to the "
    "pressure printed on their side. Clean the chain with a dry cloth after wet rides and oil it lightly "
    "once a month, wiping off what is left on the outside. Test the brakes before every ride: each lever "
    "should stop well before it touches the handlebar. Once a year, take the bicycle to a shop to have "
    "the wheels trued and the cables replaced.",

    "Weather for Thursday: a cold, bright start with a touch of frost in sheltered valleys. Cloud will "
    "build from the west during the morning, and rain will reach western coasts by early afternoon, "
    "spreading east in the evening. The rain may be heavy at times over the hills. Winds will be light "
    "at first but will strengthen to gales on exposed coasts overnight. Highest temperatures eight to "
    "eleven degrees, lowest overnight five degrees.",

    "The library will be closed on public holidays. On other days it opens at nine in the morning and "
    "closes at eight in the evening, except on Saturdays, when it closes at five. Members may borrow up "
    "to twelve items at a time for three weeks, and renew them online or by phone unless another member "
    "has reserved them. Late returns are charged twenty pence a day for adults. Children's books carry "
    "no late charge.",

    "Water boils at one hundred degrees Celsius at sea level, but at a lower temperature higher up, "
    "because the air pressure is lower. On a high mountain it may boil at only seventy degrees, which is "
    "why food takes longer to cook there. A pressure cooker works the other way round: it traps the "
    "steam, raising the pressure inside, so the water boils at about one hundred and twenty degrees and "
    "food cooks faster.",
)

TOPICS: tuple[str, ...] = (
    "a fox who learns to swim", "why people enjoy gardening", "the first day at a new school",
    "a robot that wants to paint", "how to plan a week of meals", "a storm at sea",
    "what makes a good friend", "a journey across a desert", "the life of an old oak tree",
    "learning to play the piano as an adult", "a city on the moon", "a lost dog finding its way home",
    "how to stay calm before an exam", "a market on a winter morning", "a dragon who is afraid of fire",
    "the smell of rain",
)

WARMUP_KEPT = 2  # the last passages and topics: the warm-up's, never a measured request's

COPY_TASKS: tuple[str, ...] = (  # the passage first, as a RAG prompt puts its document: shared prefixes
    "{passage}\n\nRepeat the text above exactly, word for word.",
    "{passage}\n\nQuote the text above in full.",
    "{passage}\n\nRewrite the text above, keeping every sentence as it is.",
)

OPEN_TASKS: tuple[str, ...] = (
    "Write a short story about {topic}.",
    "Write a few paragraphs about {topic}.",
    "Tell me about {topic}, in your own words.",
)
