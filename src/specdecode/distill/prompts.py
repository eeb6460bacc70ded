"""Training prompts built from templates, never from an evaluation set.

Two stages: `seed_prompts` asks for articles, stories, code, explanations, role play, arithmetic
and reasoning; the target's answers then become the passages of `passage_prompts` (summarise,
answer from a text, extract from it, translate a sentence of it, rewrite it), which teach the
copying that summarisation and retrieval-augmented answers are made of. Its translations become
passages in their own language, to be translated back.
"""

from __future__ import annotations

import random
import re

TOPICS = [
    "the ocean tides", "volcanoes", "a city park", "baking bread", "the moon landing", "chess openings", "rivers",
    "honey bees", "night trains", "photosynthesis", "thunderstorms", "public libraries", "bicycles", "coffee",
    "mountain climbing", "the printing press", "recycling plastic", "running a marathon", "deserts", "learning piano",
    "electric cars", "the Roman empire", "black holes", "vaccines", "the stock market", "climate change", "glaciers",
    "ancient Egypt", "solar panels", "the internet", "sleep", "friendship", "remote work", "urban gardening",
    "the French revolution", "machine learning", "earthquakes", "coral reefs", "the human heart", "jazz music",
    "space telescopes", "renewable energy", "the water cycle", "video games", "healthy breakfasts", "museums",
    "the Olympic games", "migrating birds", "smartphones", "rain forests", "inflation", "democracy", "dinosaurs",
    "the immune system", "wind turbines", "Shakespeare", "quantum computers", "tea ceremonies", "volunteering",
    "time management", "the Great Wall of China", "penguins", "electric guitars", "nutrition labels", "bridges",
    "artificial satellites", "wolves", "the periodic table", "job interviews", "public transport", "mushrooms",
    "the Renaissance", "cybersecurity", "yoga", "lighthouses", "the Amazon river", "bees and pollination",
    "3D printing", "saving money", "camping", "the history of writing", "submarines", "autumn leaves",
]
WRITING = [
    "Write a short article about {t}.", "Write a short story that involves {t}.", "Write a poem about {t}.",
    "Write a blog post about {t}.", "Write a persuasive paragraph about why {t} matters.",
    "Write a letter to a friend describing {t}.", "Write a product description inspired by {t}.",
    "Write a news report about a recent discovery related to {t}.", "Describe {t} in detail.",
]
QUESTIONS = [
    "Explain {t} to a ten-year-old.", "What are the main facts about {t}?", "List five interesting facts about {t}.",
    "What are the advantages and disadvantages of {t}?", "How does {t} work?", "Why is {t} important?",
    "Give me some tips about {t}.", "What is the history of {t}?", "Compare {t} with {u}.",
    "What would happen if there were no {t}?", "Answer briefly: what is the most important thing about {t}?",
    "Who first studied {t}?", "When did people start to use {t}?", "Where can you find {t}?",
    "Please explain the differences between {t} and {u}, and give a real-world example of each.",
    "Explain what {t} is and list five specific examples of how it affects daily life.",
]
ROLES = ["a tour guide", "a doctor", "a teacher", "a software engineer", "a chef", "a detective", "a historian",
         "a travel agent", "a personal trainer", "a customer support agent", "a poet", "a scientist"]
ROLEPLAY = [
    "Now you are {r}. Explain {t} to a customer in simple words.",
    "Pretend to be {r}. Someone asks you: what do you think about {t}?",
    "Act as {r} and give advice to a beginner who wants to learn about {t}.",
    "You are {r}. Write a short speech about {t}.",
]
CODE = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "sorts a list of dictionaries by a key", "counts the words in a text", "merges two sorted lists",
    "finds the largest element of a list", "removes duplicates from a list while keeping order",
    "converts Celsius to Fahrenheit", "reads a CSV file and sums a column", "checks whether a string is a palindrome",
    "computes the factorial of a number", "flattens a nested list", "finds the most common character in a string",
    "implements binary search", "validates an email address with a regular expression", "computes a moving average",
    "parses a date string", "transposes a matrix", "implements a stack class",
]
LANGUAGES = ["Python", "JavaScript", "C++", "Java", "Rust", "Go"]
TARGET_LANGUAGES = ["French", "German", "Spanish", "Italian", "Portuguese", "Chinese", "Japanese"]
PASSAGE_TASKS = [
    "Summarize the following text in a few sentences.\n\n{p}",
    "Summarize the following text in one sentence:\n{p}",
    "Read the text below and list its key points.\n\n{p}",
    "{p}\n\nWhat is the main idea of the text above?",
    "Answer the question using only the passage.\n\nPassage: {p}\n\nQuestion: What does the passage say about {t}?",
    "Based on the following document, answer: what are the most important details?\n\nDocument:\n{p}",
    "Rewrite the following text in simpler words:\n{p}",
    "Translate the following sentence into {l}: {s}",
    "Correct the grammar of this text and return it:\n{p}",
    "Write a title for this text and then summarize it.\n\n{p}",
    "Summarize: {p}",
    "{p}\n\nAnswer the question based on the text above: what is it mostly about?",
    "Please read the paragraph below and list every number and name it mentions.\n{p}",
    "Extract the main facts from the text below as a bulleted list.\n\n{p}",
]
TRANSLATED = re.compile(r"Translate the following sentence into (\w+): ")  # its answer: a passage in that language
# prompts that quote an earlier answer written in another language (`{l}`): translated back
FOREIGN_TASKS = ["Translate {l} to English: {p}", "Translate the following {l} text into English.\n\n{p}"]


def _math_problem(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 60), rng.randint(2, 12)
    item = rng.choice(["apples", "books", "pencils", "tickets", "cookies", "marbles", "stickers"])
    name = rng.choice(["Anna", "Ben", "Carlos", "Dana", "Emma", "Farid", "Grace", "Hiro"])
    return rng.choice([
        f"{name} has {a} {item} and buys {b} more. Then {name} gives away {c}. How many {item} are left?",
        f"A box holds {c} {item}. How many {item} are in {a} boxes? Explain step by step.",
        f"{name} reads {a} pages a day. How many days does it take to read a book of {a * c + b} pages?",
        f"What is {a} times {b} plus {c}? Show your work.",
        f"Solve for x: {c}x + {a} = {c * b + a}.",
        f"A train travels at {a} km/h for {c} hours. How far does it go?",
        f"x + y = {a}, x - y = {b % a if b % a else 1}. What are x and y?",
        f"A farmer has {c} cows and each gives {a % 9 + 2} liters of milk a day. How many more cows does the "
        f"farmer need to get {(c + b % 5 + 1) * (a % 9 + 2)} liters a day?",
        f"Each problem consists of three statements. 1. {item.capitalize()} cost more than pens. "
        f"2. {item.capitalize()} cost less than bags. 3. Bags cost more than pens. If the first two "
        "statements are true, is the third true, false, or uncertain?",
        f"If {name} earns ${a} per hour and works {c} hours a day for {b % 7 + 1} days, how much does {name} earn?",
    ])


def seed_prompts(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n (topic, prompt) pairs of mixed kinds (writing, questions, code, arithmetic), reproducible
    from `seed`."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        t, u = rng.sample(TOPICS, 2)
        kind = rng.random()
        if kind < 0.3:
            out.append((t, rng.choice(WRITING).format(t=t)))
        elif kind < 0.6:
            out.append((t, rng.choice(QUESTIONS).format(t=t, u=u)))
        elif kind < 0.7:
            out.append((t, rng.choice(ROLEPLAY).format(t=t, r=rng.choice(ROLES))))
        elif kind < 0.85:
            out.append(("code", f"Write a {rng.choice(LANGUAGES)} function that {rng.choice(CODE)}."))
        else:
            out.append(("arithmetic", _math_problem(rng)))
    return out


def passage_prompts(passages: list[tuple[str, str]], n: int, seed: int = 0) -> list[str]:
    """n prompts that quote a (topic, passage) pair: summarise, answer from it, translate from it; a
    passage whose topic is `foreign:LANGUAGE` (an answer in that language) is translated to English."""
    if not passages:
        return []
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        topic, passage = rng.choice(passages)
        if topic.startswith("foreign:"):
            out.append(rng.choice(FOREIGN_TASKS).format(l=topic.split(":", 1)[1], p=passage))
            continue
        sentences = [s.strip() for s in passage.replace("\n", " ").split(". ") if len(s.split()) >= 4]
        sentence = (rng.choice(sentences) if sentences else passage[:200]).rstrip(".") + "."
        task = rng.choice(PASSAGE_TASKS)
        out.append(task.format(p=passage, t=topic, l=rng.choice(TARGET_LANGUAGES), s=sentence))
    return out
